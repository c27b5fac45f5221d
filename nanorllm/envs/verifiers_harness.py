"""The program that plays a verifiers seat during training: one chat completion per segment, run in this process.

verifiers 0.4.0 runs a seat's program (its harness) inside a runtime: its built-in `null` and `bash` harnesses are
PEP 723 scripts that `uv` installs from the package index (verifiers/v1/runtimes/base.py `prepare_uv_script`,
verifiers/v1/harnesses/utils/launch.py `CHAT_PROGRAM`), on a remote Prime sandbox unless the seat names another
runtime (verifiers/v1/configs/agent.py `AgentConfig.runtime = PrimeConfig()`). Its `Harness.launch` contract allows a
loop run in-process "as long as every model call goes through endpoint + secret" (verifiers/v1/harness.py): this is
that loop, with no package index, no sandbox and no process of its own. Its requests go to the rollout's interception
server, which records the turn on verifiers' trace and forwards it to the run's endpoint (rollout/endpoint.py).

It serves text conversations: a task's prompt (text or messages) and, on a resumed segment, the conversation so far
(a multi-turn env's user turns). MCP tools are verifiers' own harnesses' (SUPPORTS_MCP is off: verifiers refuses
the pairing with its own message). verifiers finds a harness by importing its id: `HARNESS_ID` names this module
under verifiers' harness package.
"""

import sys

import httpx
import verifiers.v1 as vf
from verifiers.v1.dialects.chat import message_to_wire
from verifiers.v1.types import UserMessage

HARNESS_ID = "nanorllm-chat"


class ChatHarnessConfig(vf.HarnessConfig):
    id: str = HARNESS_ID


class ChatHarness(vf.Harness[ChatHarnessConfig]):
    APPENDS_SYSTEM_PROMPT = True
    SUPPORTS_RESUME = True
    EXECUTES_CODE = False
    NEEDS_CONTAINER = False

    async def launch(self, ctx, trace, runtime, endpoint, secret, mcp_urls, data, tool_interception_url=None):
        system, prompt = self.resolve_prompt(data)
        messages = [{"role": "system", "content": system}] if system else []
        turns = [UserMessage(content=prompt)] if isinstance(prompt, str) else list(prompt or [])
        messages += [message_to_wire(m) for m in turns]
        async with httpx.AsyncClient(timeout=None, trust_env=False) as http:  # loopback: no proxy sees the secret
            reply = await http.post(f"{endpoint.rstrip('/')}/chat/completions", json={"model": ctx.model,
                                    "messages": messages}, headers={"Authorization": f"Bearer {secret}"})
        if reply.status_code >= 400:
            return vf.ProgramResult(exit_code=1, stdout="", stderr=f"HTTP {reply.status_code}: {reply.text[:2000]}")
        return vf.ProgramResult(exit_code=0, stdout="", stderr="")


__all__ = ["ChatHarness"]
sys.modules.setdefault(f"verifiers.v1.harnesses.{HARNESS_ID.replace('-', '_')}", sys.modules[__name__])
