"""verify --logits, controller side: the last captured layer's logits rebuilt on the host against the engine's."""

from __future__ import annotations

from dataclasses import dataclass, field

from remote_ops.connect import agent_requests as rq
from remote_ops.errors import UsageError
from remote_ops.records import Record


@dataclass(eq=False)
class LogitsResult(Record):
    """The record of ``verify --logits`` (``verify``'s ``logits`` key): ``applies`` False when the last
    captured layer is not the model's last (``why`` says which it is), None when that is unknown;
    ``top1`` and ``mean_abs_delta`` over ``positions`` of ``files`` sampled files; ``ok`` when both
    thresholds hold (or the check does not apply)."""

    ok: bool = False
    applies: bool | None = None
    files: int = 0
    positions: int = 0
    top1: float | None = None
    mean_abs_delta: float | None = None
    extra: dict = field(default_factory=dict)


def check_args(logits: int, logits_port: int | None) -> None:
    if logits < 0:
        raise UsageError("--logits must be 0 (off) or a number of files")
    if logits_port is not None and not 0 < logits_port < 65536:
        raise UsageError(f"--logits-port {logits_port} is not a TCP port")


def server_port(st: dict | None) -> int | None:
    """The port of the job's own server while it answers (a server-flow job that runs), else None."""
    srv = (st or {}).get("server") or {}
    if (st or {}).get("state") in ("running", "starting") and srv.get("state") == "healthy":
        return srv.get("port")
    return None


def check(session, *, output_dir: str, layout: str | None, n: int, port: int | None,
          seed: int = 0) -> LogitsResult:
    """The logits check of ``n`` sampled files of ``output_dir`` on the session's host, against the vLLM
    server on the host's loopback ``port`` (the check names the engine it needs when there is none)."""
    args = {"output_dir": output_dir, "n": n, "seed": seed}
    if layout:
        args["layout"] = layout
    if port:
        args["port"] = int(port)
    res = session.call(*rq.logits_check(**args), timeout=900)
    return LogitsResult.from_json(res)


def lines(r: LogitsResult) -> list[str]:
    """The check for people: one verdict line, then the problems."""
    if r.applies is False:
        return [f"logits: {r.extra.get('why')}"]
    if r.positions:
        head = (f"logits: {'ok' if r.ok else 'FAILED'}: top-1 agreement {100 * r.top1:.2f}% (>= "
                f"{100 * r.extra.get('min_top1', 0):.0f}%), mean |delta logprob| {r.mean_abs_delta:.4f} (<= "
                f"{r.extra.get('max_mean_delta')}) over {r.positions} positions of {r.files} file(s), against the "
                f"engine on port {r.extra.get('port')}")
    else:
        head = f"logits: not checked: {r.extra.get('why')}"
    out = [head]
    if not r.ok and r.positions and r.extra.get("why"):
        out.append(f"  {r.extra['why']}")
    out += [f"  logits: {p}" for p in (r.extra.get("problems") or [])[:10]]
    return out
