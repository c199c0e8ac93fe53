"""Gradients of gradients: 'memory' for both, against plain autodiff."""

from __future__ import annotations



HIGHER_TARGETS = (0.9, 1e-5)  # 'memory' for both gradients: peak vs plain, gradient error


def higher_suite(rounds):
    """Gradients of gradients (scripts/higher_order.py's workloads at their defaults): a
    WGAN-GP critic step and a 2-layer LSTM's Hessian-vector product, nested tapes and two
    direct calls, each variant against plain (peak and time: medians of min(rounds, 5) calls;
    target: 'memory' for both gradients <= 0.9x of plain's peak, exact to 1e-5)."""
    import higher_order

    sizes = higher_order.parse_args([])
    rows = []
    for name in ("wgan", "lstm"):
        title, make_step, x = higher_order.workload(name, sizes)
        for entry in ("tape", "gradients"):
            results = higher_order.variant_results(make_step, x, entry, min(rounds, 5))
            plain_peak, plain_ms = results["plain"][:2]
            for variant, (peak, ms, error, calls) in results.items():
                rows.append({"suite": "higher", "case": f"{title}; entry: {entry}", "variant": variant,
                             "failure": None, "time_ratio": ms / plain_ms, "ms": ms,
                             "memory_ratio": peak / plain_peak, "peak_mib": peak,
                             "gradient_error": error, "calls": calls})
    return rows
