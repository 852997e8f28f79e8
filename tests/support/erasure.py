"""What the erasure tests share: a workflow whose customer email and name are personal
data, two customers, the step executor that copies personal values into a step's output
and state patch (``executor = "tests.support.erasure:Greeter"`` for the CLI), and the
run that puts them in every kind of event that carries state."""

from __future__ import annotations

from typing import Any, Final

from jobledger import Engine, StepRequest, StepResult

ONBOARDING: Final = """
type: onboarding
version: 1
personal_data: [customer.email, customer.name]
start: greet
steps:
  greet: {kind: run_interaction_task, params: {task: greet}, next: confirm}
  confirm: {kind: wait_event, event: customer.confirmed, next: done}
  done: {kind: complete}
"""
ADA: Final = {"customer": {"email": "ada@example.com", "name": "Ada Lovelace", "plan": "gold"}}
GRACE: Final = {"customer": {"email": "grace@example.com", "name": "Grace Hopper", "plan": "basic"}}
CONFIRMED_EMAIL: Final = "ada.l@example.org"
"""The email ada's confirmation signal carries (personal too)."""
PLAINTEXT: Final = (b"ada@example.com", b"Ada Lovelace", CONFIRMED_EMAIL.encode())
"""Ada's personal values, as no stored, exported or published byte may hold them."""


class Greeter:
    """Copies the customer into its output and patches the state with it (both personal)."""

    def execute(self, request: StepRequest) -> StepResult:
        customer = dict(request.job.state["customer"])
        return StepResult(
            output={"greeted": True, "customer": {"email": customer["email"]}},
            state_patch={"customer": {**customer, "greeted": True}},
        )


def confirmation(state: dict[str, Any]) -> dict[str, Any]:
    """The payload of the customer.confirmed signal: a new email, still personal."""
    return {"customer": {**state["customer"], "email": CONFIRMED_EMAIL}, "confirmed": True}


def run_onboarding(engine: Engine, job_id: str, subject: str | None, state: dict[str, Any]) -> None:
    """Submitted, a step's output and patch, a Resumed payload: all hold personal values."""
    engine.submit("acme", job_id, "onboarding", input=state, data_subject=subject)
    engine.run_until_idle()
    engine.signal(
        "acme", job_id, "customer.confirmed", confirmation(state), signal_id=f"{job_id}-confirmed"
    )
    engine.run_until_idle()
