"""End of turn for any chat template: the stop set holds the template's end-of-turn token even when it
is not the tokenizer's eos, and turn k+1's prompt never repeats the one the response ended with."""

import pytest

from nanorllm.policy.chat_render import end_of_turn_ids
from nanorllm.policy.hf_causal import HFCausalPolicy
from nanorllm.policy.byte_tokenizer import CHATML_TEMPLATE, tiny_tokenizer
from nanorllm.policy.models import tiny_model

LLAMA3 = ("{{ '<|begin_of_text|>' }}{% for m in messages %}{{ '<|start_header_id|>' + m['role'] + "
          "'<|end_header_id|>\n\n' + m['content'] + '<|eot_id|>' }}{% endfor %}{% if add_generation_prompt %}"
          "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}")
GEMMA = ("{{ '<bos>' }}{% for m in messages %}{{ '<start_of_turn>' + ('model' if m['role'] == 'assistant' "
         "else m['role']) + '\n' + m['content'] + '<end_of_turn>\n' }}{% endfor %}{% if add_generation_prompt %}"
         "{{ '<start_of_turn>model\n' }}{% endif %}")
# an end-of-turn token no list knows: only reading the template finds it
CUSTOM = ("{% for m in messages %}{{ '[' + m['role'] + ']' + m['content'] + '<|turn_over|>' }}{% endfor %}"
          "{% if add_generation_prompt %}{{ '[assistant]' }}{% endif %}")

TEMPLATES = {  # name: (template, extra special tokens, eos, end-of-turn token)
    "chatml": (CHATML_TEMPLATE, [], "<|im_end|>", "<|im_end|>"),
    "llama3": (LLAMA3, ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"],
               "<|end_of_text|>", "<|eot_id|>"),
    "gemma": (GEMMA, ["<bos>", "<start_of_turn>", "<end_of_turn>"], "<eos>", "<end_of_turn>"),
    "custom": (CUSTOM, ["<|turn_over|>"], "<|endoftext|>", "<|turn_over|>"),
}


def templated_policy(name):
    template, specials, eos, _ = TEMPLATES[name]
    tok = tiny_tokenizer()
    tok.add_special_tokens({"additional_special_tokens": specials, "eos_token": eos})
    tok.chat_template = template
    return HFCausalPolicy(tiny_model(tok), tok)


@pytest.mark.parametrize("name", list(TEMPLATES))
def test_stop_set_holds_the_templates_end_of_turn(name):
    policy = templated_policy(name)
    eot = policy.tokenizer.convert_tokens_to_ids(TEMPLATES[name][3])
    assert eot in end_of_turn_ids(policy.tokenizer)
    assert eot in policy.eos_ids and policy.tokenizer.eos_token_id in policy.eos_ids


@pytest.mark.parametrize("name", list(TEMPLATES))
def test_next_prompt_never_repeats_the_end_of_turn(name):
    policy = templated_policy(name)
    eot = policy.tokenizer.convert_tokens_to_ids(TEMPLATES[name][3])
    prompt = policy.first_prompt_ids([{"role": "user", "content": "What is 3 + 4?"}])
    answer = policy.tokenizer("\\boxed{8}", add_special_tokens=False)["input_ids"]
    nxt = policy.next_prompt_ids(prompt, answer + [eot], {"role": "user", "content": "Try again."})
    head = prompt + answer + [eot]
    assert nxt[:len(head)] == head and nxt[len(head)] != eot
    assert nxt.count(eot) == head.count(eot) + 1  # the new user message's own end, nothing more
    # what the template renders for the same conversation, token for token
    msgs = [{"role": "user", "content": "What is 3 + 4?"}, {"role": "assistant", "content": "\\boxed{8}"},
            {"role": "user", "content": "Try again."}]
    text = policy.tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert nxt == policy.tokenizer(text, add_special_tokens=False)["input_ids"]
    # a response cut before its end-of-turn gets the template's end-of-turn added
    cut = policy.next_prompt_ids(prompt, answer, {"role": "user", "content": "Try again."})
    assert cut[len(prompt) + len(answer)] == eot
