"""The default bounds on user code and env servers, written once: the config's fields (config/fields.py), the env
spec (envs/registry.py), the episode settings (envs/base.py) and the code that enforces each read them from here."""

GRADER_TIMEOUT_S = 5.0  # CPU seconds of one answer check (--grader-timeout-s)
TOOL_TIMEOUT_S = 10.0  # wall seconds of one tool call (--tool-timeout-s)
MAX_TOOL_CALLS = 4  # tool calls a turn may make (--max-tool-calls)
REWARD_TIMEOUT_S = 30.0  # wall seconds of one reward-function call (--reward-timeout-s)
ENV_TIMEOUT_S = 30.0  # wall seconds of one call to an env server (--env-timeout-s)
AGENT_TIMEOUT_S = 300.0  # wall seconds of one --agent episode (--agent-timeout-s)
