"""HFCausalPolicy: a local transformers causal LM as a policy.

Why our own sampling loop instead of `model.generate`: we need, for every sampled token, its
log-probability under exactly the distribution the learner will score (logits / temperature, full
vocabulary), and `generate` would have to keep (B, T, V) logits around to give us that. The loop is
a plain KV-cached decode: left-padded prompts, one forward per new token, each finished row
padded until the whole batch is done.

Prompts are token streams, not re-rendered text: turn k+1's prompt is turn k's prompt + the sampled
response ids + the tokens of the new user message. Every later prompt therefore extends the earlier
one token for token, the learner can score all turns of an episode in one sequence, and no
decode/re-encode round trip can change a token the policy sampled.
"""

import inspect
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers import DynamicCache
from transformers.utils import logging as hf_logging

from nanorllm.policy.base import Generation, Policy, SamplingParams
from nanorllm.policy.models import load_model_and_tokenizer

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
_SENTINEL = "\x00NANORLLM_SENTINEL\x00"
hf_logging.disable_progress_bar()


@dataclass
class ForwardOutput:
    logits: torch.Tensor  # (N, V) logits only at the N positions the batch asks for


class HFCausalPolicy(Policy):
    trainable = True

    def __init__(self, model, tokenizer, *, device: str = "cpu", seed: int = 0):
        self.model = model.to(device)
        self.tokenizer = tokenizer
        self.device = torch.device(device)
        self.version = 0
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        self.pad_id = tokenizer.pad_token_id
        eos = model.generation_config.eos_token_id if model.generation_config else None
        eos = [eos] if isinstance(eos, int) else list(eos or [])
        self.eos_ids = sorted({tokenizer.eos_token_id, *eos} - {None})
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(seed)
        # transformers renamed `past_key_values` to `cache`; the cache object is updated in place.
        self._cache_kw = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"

    @classmethod
    def from_name(cls, name: str, *, device: str = "cpu", dtype: str = "float32", seed: int = 0):
        model, tokenizer = load_model_and_tokenizer(name, dtype=DTYPES[dtype])
        return cls(model, tokenizer, device=device, seed=seed)

    def seed(self, seed: int) -> None:
        self.generator.manual_seed(seed)

    # ---- prompts as token streams ----------------------------------------------------------
    def first_prompt_ids(self, messages: list[dict]) -> list[int]:
        text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def next_prompt_ids(self, prompt_ids: list[int], response_ids: list[int], new_message: dict) -> list[int]:
        # Render a placeholder assistant turn followed by the new message; the text after the
        # placeholder is the end-of-turn marker, the new message and the generation prompt.
        msgs = [{"role": "user", "content": "x"}, {"role": "assistant", "content": _SENTINEL}, new_message]
        text = self.tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        tail = text.split(_SENTINEL, 1)[1]
        eos_text = self.tokenizer.eos_token
        if response_ids and response_ids[-1] == self.tokenizer.eos_token_id and tail.startswith(eos_text):
            tail = tail[len(eos_text):]  # the sampled response already ends with it
        return prompt_ids + response_ids + self.tokenizer(tail, add_special_tokens=False)["input_ids"]

    # ---- sampling --------------------------------------------------------------------------
    @torch.no_grad()
    def generate(self, conversations: list[list[dict]], prompt_ids: list[list[int]],
                 params: SamplingParams) -> list[Generation]:
        model, dev = self.model, self.device
        B, T = len(prompt_ids), max(len(p) for p in prompt_ids)
        input_ids = torch.full((B, T), self.pad_id, dtype=torch.long)
        attn = torch.zeros((B, T), dtype=torch.long)
        for i, p in enumerate(prompt_ids):  # left padding: every row's next token is at column T
            input_ids[i, T - len(p):] = torch.tensor(p)
            attn[i, T - len(p):] = 1
        input_ids, attn = input_ids.to(dev), attn.to(dev)
        pos = (attn.cumsum(-1) - 1).clamp(min=0)  # (B, T)
        eos = torch.tensor(self.eos_ids, device=dev)
        was_training = model.training
        model.eval()
        cache = {self._cache_kw: DynamicCache()}
        out = model(input_ids=input_ids, attention_mask=attn, position_ids=pos, use_cache=True, logits_to_keep=1,
                    **cache)
        pos = pos[:, -1:]
        finished = torch.zeros(B, dtype=torch.bool, device=dev)
        tokens, logprobs = [], []
        for _ in range(params.max_new_tokens):
            tok, lp = self._sample(out.logits[:, -1].float(), params)  # (B,), (B,)
            tok = torch.where(finished, self.pad_id, tok)
            tokens.append(tok)
            logprobs.append(torch.where(finished, 0.0, lp))
            finished |= torch.isin(tok, eos)
            if bool(finished.all()):
                break
            attn = torch.cat([attn, torch.ones((B, 1), dtype=attn.dtype, device=dev)], dim=1)
            pos = pos + 1
            out = model(input_ids=tok[:, None], attention_mask=attn, position_ids=pos, use_cache=True, **cache)
        model.train(was_training)
        tokens = torch.stack(tokens, 1).tolist()  # (B, R)
        logprobs = torch.stack(logprobs, 1).tolist()
        gens = []
        for row, lps in zip(tokens, logprobs):
            n = next((j + 1 for j, t in enumerate(row) if t in self.eos_ids), None)
            ids = row[:n] if n else row
            text = self.tokenizer.decode(ids, skip_special_tokens=True)
            gens.append(Generation(text=text, response_ids=ids, logprobs=lps[:len(ids)], truncated=n is None))
        return gens

    def _sample(self, logits: torch.Tensor, params: SamplingParams) -> tuple[torch.Tensor, torch.Tensor]:
        """Next token and its logprob under softmax(logits / temperature) over the full vocabulary."""
        if params.greedy:
            tok = logits.argmax(-1)
            return tok, F.log_softmax(logits, -1).gather(-1, tok[:, None])[:, 0]
        logp = F.log_softmax(logits / params.temperature, -1)  # (B, V)
        probs = logp.exp()
        if params.top_p < 1.0:
            sorted_p, idx = probs.sort(-1, descending=True)
            drop = sorted_p.cumsum(-1) - sorted_p > params.top_p  # keep the smallest head with mass >= top_p
            probs = probs.scatter(-1, idx, sorted_p.masked_fill(drop, 0.0))
        tok = torch.multinomial(probs, 1, generator=self.generator)[:, 0]
        return tok, logp.gather(-1, tok[:, None])[:, 0]

    # ---- scoring for the learner -------------------------------------------------------------
    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                positions: torch.Tensor) -> ForwardOutput:
        """Logits only where a token is scored.

        input_ids, attention_mask: (B, T); positions: (N, 2) rows of (b, t) whose logits predict
        token t + 1. Running the LM head on N positions instead of B*T saves the (B, T, V) tensor.
        """
        base = getattr(self.model, self.model.base_model_prefix)
        hidden = base(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state  # (B, T, H)
        picked = hidden[positions[:, 0], positions[:, 1]]  # (N, H)
        return ForwardOutput(logits=self.model.get_output_embeddings()(picked))  # (N, V)

    def parameters(self):
        return self.model.parameters()

    def save(self, path: str) -> None:
        self.model.save_pretrained(path)
        self.tokenizer.save_pretrained(path)
