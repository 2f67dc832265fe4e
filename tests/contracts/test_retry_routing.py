"""Gateway retries when primaries die together: the last attempt goes to the backup (pure routing)."""

from __future__ import annotations

from scanflow.serving.routing import MAX_ATTEMPTS, Upstream, choose_attempt


def _ups() -> tuple[list[Upstream], Upstream]:
    return [Upstream("http://a", healthy=True), Upstream("http://b", healthy=True)], Upstream("http://bk", healthy=True)


def test_all_primaries_dying_reaches_the_backup_within_the_attempts() -> None:
    """a fails (marked unhealthy), b still looks healthy and fails too: the last attempt is the backup."""
    reps, backup = _ups()
    exclude: frozenset[str] = frozenset()
    tried = []
    for attempt in range(MAX_ATTEMPTS):
        _, up = choose_attempt("auto", reps, backup, exclude, 0, last=attempt == MAX_ATTEMPTS - 1)
        assert up is not None
        tried.append(up.url)
        if up is backup:
            break
        up.healthy = False  # what the gateway does on a connection error
        exclude |= {up.url}
    assert tried == ["http://a", "http://b", "http://bk"]


def test_last_attempt_prefers_backup_over_a_healthy_looking_primary() -> None:
    reps, backup = _ups()
    reps.append(Upstream("http://c", healthy=True))
    route, up = choose_attempt("auto", reps, backup, frozenset({"http://a", "http://b"}), 0, last=True)
    assert (route, up) == ("backup", backup)


def test_first_attempt_and_non_last_retries_stay_on_primaries() -> None:
    reps, backup = _ups()
    assert choose_attempt("auto", reps, backup, frozenset(), 0, last=True)[1] in reps  # nothing failed yet
    assert choose_attempt("auto", reps, backup, frozenset({"http://a"}), 0, last=False)[1] is reps[1]


def test_explicit_primary_route_and_unhealthy_backup_are_respected() -> None:
    reps, backup = _ups()
    assert choose_attempt("primary", reps, backup, frozenset({"http://a"}), 0, last=True)[1] is reps[1]
    backup.healthy = False
    assert choose_attempt("auto", reps, backup, frozenset({"http://a"}), 0, last=True)[1] is reps[1]
    assert choose_attempt("auto", reps, None, frozenset({"http://a"}), 0, last=True)[1] is reps[1]
