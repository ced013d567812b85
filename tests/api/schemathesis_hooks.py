"""schemathesis hooks for tests/api/schemathesis.rs (issue 25): what the run needs to stay
bounded in time, which is no part of the API's contract (docs/openapi.json is)."""

import re

import schemathesis

BULK = "POST /api/v1/tasks/bulk"

# A W3C traceparent as the API takes it (docs/openapi.json's pattern, and the two rules a
# pattern without lookaheads cannot state: version ff and all-zero ids are invalid).
TRACEPARENT = re.compile(r"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-[0-9a-f]{2}$")
A_TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def valid_traceparent(value):
    m = TRACEPARENT.match(value)
    return bool(m) and m.group(1) != "ff" and m.group(2).strip("0") and m.group(3).strip("0")


@schemathesis.hook
def before_call(context, case, kwargs):
    # A bulk retry makes a new task of each canceled one it matches, and the run cancels
    # in bulk too: each round doubles the table (240,000 tasks and minutes in one run).
    # A retry is counted (a dry run, the same answer's shape) instead of made. Only a
    # dry_run the body leaves out or gives as false or null is set (schemathesis checks
    # the request it sends, as changed here).
    body = case.body
    if (
        case.operation.label == BULK
        and isinstance(body, dict)
        and body.get("action") == "retry"
        and (body.get("dry_run") is None or body.get("dry_run") is False)
    ):
        body["dry_run"] = True
    # schemathesis does not generate header values from a pattern that needs other
    # characters than letters and digits (its PR 4205: the traceparent's dashes), and
    # sends a positive case's traceparent as, e.g., "0", which the API rightly refuses
    # (400): such a case gets a traceparent of the documented form instead. Negative
    # cases keep theirs.
    mode = getattr(getattr(getattr(case, "meta", None), "generation", None), "mode", None)
    positive = mode is None or "positive" in str(getattr(mode, "value", mode)).lower()
    if positive:
        # The case, and the request's own headers made from it (both: the checks read
        # the case, the request is sent from these).
        for headers in (case.headers, kwargs.get("headers") if isinstance(kwargs, dict) else None):
            if headers is None or not hasattr(headers, "get"):
                continue
            value = headers.get("traceparent")
            if isinstance(value, str) and not valid_traceparent(value):
                headers["traceparent"] = A_TRACEPARENT
