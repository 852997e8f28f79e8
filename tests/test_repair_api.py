"""``POST /v1/jobs/{tenant}/{job}/retry | reset | fork`` on SQLite and PostgreSQL: an
operator repairs, recorded as the authenticated caller; another role is a 403, a tenant
the caller does not see and an unknown job a 404, a wrong status a 409, a step out of
range a 422, each writing nothing."""

from __future__ import annotations

from jobledger import Engine, JobStatus, StepError, StepRequest
from jobledger.domain.job import Job
from tests.support.engines import CountingExecutor
from tests.support.http import ApiServer, problem


def failed_job(engine: Engine, executor: CountingExecutor) -> None:
    def fail(request: StepRequest) -> Exception | None:
        return StepError("boom", retryable=False) if request.step_number == 3 else None

    executor.fail_with = fail
    engine.submit("acme", "j", "agent3")
    engine.run_until_idle()
    executor.fail_with = None
    assert engine.job("acme", "j").status is JobStatus.FAILED


def test_an_operator_retries_resets_and_forks_over_http(
    api: ApiServer, engine: Engine, executor: CountingExecutor
) -> None:
    failed_job(engine, executor)
    with api.as_role("operator", sub="olga") as http:
        retried = http.post("/v1/jobs/acme/j/retry", json={"reason": "fixed"})
        assert retried.status_code == 200, retried.text
        assert retried.json()["job"]["status"] == "queued"
        engine.run_until_idle()
        reset = http.post("/v1/jobs/acme/j/reset", json={"step": 1, "reason": "again"})
        assert reset.status_code == 200, reset.text
        assert reset.json()["job"]["current_step"] == 1
        engine.run_until_idle()
        forked = http.post(
            "/v1/jobs/acme/j/fork",
            json={"step": 2, "new_job_id": "f", "reason": "variant", "input_patch": {"v": 2}},
        )
        assert forked.status_code == 200, forked.text
        assert forked.json()["job"]["state"]["v"] == 2
        assert forked.json()["origin"]["job_id"] == "j"
    engine.run_until_idle()
    assert engine.job("acme", "j").status is JobStatus.COMPLETED
    assert engine.job("acme", "f").status is JobStatus.COMPLETED
    history = engine.store.events(engine.jobs.load("acme", "j").id)
    by = [
        getattr(e, "retried_by", None) or getattr(e, "reset_by", None) or e.forked_by  # type: ignore[attr-defined]
        for e in history
        if isinstance(e, Job.Retried | Job.Reset | Job.Forked)
    ]
    assert by == ["olga", "olga", "olga"]


def test_repairs_over_http_are_refused_with_the_right_problem_and_write_nothing(
    api: ApiServer, engine: Engine, executor: CountingExecutor
) -> None:
    failed_job(engine, executor)
    version = engine.job("acme", "j").version
    with api.as_role("auditor") as http:
        problem(http.post("/v1/jobs/acme/j/retry", json={"reason": "r"}), 403)
    with api.as_role("operator", tenant="globex") as http:
        # Another tenant's job is not there for the caller (the API's rule: no leak).
        problem(http.post("/v1/jobs/acme/j/retry", json={"reason": "r"}), 404)
    with api.as_role("operator") as http:
        problem(http.post("/v1/jobs/acme/nope/retry", json={"reason": "r"}), 404)
        out_of_range = problem(
            http.post("/v1/jobs/acme/j/reset", json={"step": 7, "reason": "r"}), 422
        )
        assert "cannot be reset to step 7" in out_of_range["detail"]
        problem(
            http.post("/v1/jobs/acme/j/fork", json={"step": 9, "new_job_id": "f", "reason": "r"}),
            422,
        )
        problem(http.post("/v1/jobs/acme/j/reset", json={"step": 1, "reason": "r", "by": "x"}), 400)
        assert engine.job("acme", "j").version == version
        http.post("/v1/jobs/acme/j/retry", json={"reason": "r"})
        engine.run_until_idle()
        wrong_status = problem(http.post("/v1/jobs/acme/j/retry", json={"reason": "r"}), 409)
        assert wrong_status["error"] == "RepairStatusError"
        engine.submit("acme", "taken", "agent3")
        taken = {"step": 1, "new_job_id": "taken", "reason": "r"}
        conflict = problem(http.post("/v1/jobs/acme/j/fork", json=taken), 409)
        assert conflict["error"] == "JobConflictError"
