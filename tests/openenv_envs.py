"""The small OpenEnv environments tests/test_openenv.py serves: one that echoes, one whose Action has two text
fields, one that refuses concurrent sessions, and two MCP environments the adapter refuses. Kept out of the test
module so that collecting it imports none of OpenEnv's server code (its web interface pulls in gradio)."""

from openenv.core.env_server import Action, CallToolAction, CallToolObservation, Environment, MCPEnvironment
from openenv.core.env_server import Observation, State


class EchoAction(Action):
    message: str


class EchoObservation(Observation):
    echoed: str = ""
    length: int = 0


class EchoEnv(Environment):
    """Rewards 0.5 a step, ends on 'bye'; its observation's only text field is `echoed`."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def reset(self, seed=None, episode_id=None, **kwargs) -> EchoObservation:
        return EchoObservation(echoed=f"seed {seed}")

    def step(self, action: EchoAction, timeout_s=None, **kwargs) -> EchoObservation:
        return EchoObservation(echoed=action.message, length=len(action.message), reward=0.5,
                               done=action.message == "bye")

    @property
    def state(self):
        return State()


class TwoFieldAction(Action):
    left: str
    right: str = ""


class TwoFieldEnv(EchoEnv):
    def step(self, action: TwoFieldAction, timeout_s=None, **kwargs) -> EchoObservation:
        return EchoObservation(echoed=action.left + action.right, reward=1.0, done=True)


class LonelyEnv(EchoEnv):
    SUPPORTS_CONCURRENT_SESSIONS = False


class MCPEcho(MCPEnvironment):
    SUPPORTS_CONCURRENT_SESSIONS = True


class ToolCallEnv(Environment):
    """An Environment whose Action is OpenEnv's CallToolAction (OpenEnv's echo example's server)."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def reset(self, seed=None, episode_id=None, **kwargs) -> CallToolObservation:
        return CallToolObservation(tool_name="echo_message", result="ready")

    def step(self, action: CallToolAction, timeout_s=None, **kwargs) -> CallToolObservation:
        return CallToolObservation(tool_name=action.tool_name, result=action.arguments, done=True, reward=1.0)

    @property
    def state(self):
        return State()
