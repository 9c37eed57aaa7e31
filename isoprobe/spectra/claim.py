"""Whether figure 2's numbers reproduce the rank-structure paper's claim: the embedded inputs of
time-series models are of low rank, those of text (and images) are not. Each system's ε-rank is
divided by its width (the most it can be), so that systems of any width compare; the claim holds
for a time-series model whose ratio is below every baseline's."""

from __future__ import annotations

import pandas as pd

#: the ε the statement reads, the paper's middle one, where the table has it
PREFERRED_EPSILON = 0.01
TIME_SERIES = "time series"


def is_random_init(source: str) -> bool:
    """Weights drawn at random, not trained (``scratch``, as the offline baselines are)."""
    return str(source).split(":", 1)[0] == "scratch"


def _epsilon_column(ranks: pd.DataFrame) -> str | None:
    columns = [c for c in ranks.columns if c.startswith("rank_eps")]
    preferred = f"rank_eps{PREFERRED_EPSILON:g}"
    if preferred in columns:
        return preferred
    return columns[len(columns) // 2] if columns else None


def relative_ranks(ranks: pd.DataFrame) -> pd.Series:
    """Name -> ε-rank ÷ width at the statement's ε (:data:`PREFERRED_EPSILON` or the middle
    one); empty without ranks."""
    column = _epsilon_column(ranks)
    if column is None or ranks.empty:
        return pd.Series(dtype=float)
    return ranks.set_index("model")[column] / ranks.set_index("model")["width"]


def claim_statement(ranks: pd.DataFrame) -> str | None:
    """The report's sentence on the claim, from the ε-rank table (:func:`rank_table`'s
    columns); None where there is nothing to compare (no time-series model or no baseline)."""
    ratio = relative_ranks(ranks)
    rows = ranks.set_index("model")
    series = [m for m in ratio.index if rows.loc[m, "modality"] == TIME_SERIES]
    baselines = [m for m in ratio.index if rows.loc[m, "modality"] != TIME_SERIES]
    if not series or not baselines:
        return None
    epsilon = _epsilon_column(ranks).removeprefix("rank_eps")
    lowest = min(ratio[b] for b in baselines)

    def named(models: list[str]) -> str:
        return ", ".join(f"{m} {ratio[m]:.2f}" for m in models)

    below = [m for m in series if ratio[m] < lowest]
    not_below = [m for m in series if m not in below]
    random = [b for b in baselines if is_random_init(rows.loc[b, "weights"])]
    text = (
        f"The paper's claim, time-series models embed their inputs at a lower rank than text "
        f"and images do: ε-rank ÷ width at ε={epsilon}, baselines {named(baselines)}"
    )
    if random:
        text += f" ({', '.join(random)}: random init, not trained)"
    if not not_below:
        return text + f"; every time-series model is below them: {named(series)}. It holds here."
    text += f". Not below every baseline: {named(not_below)}"
    if below:
        text += f"; below: {named(below)}"
    return text + (
        f". These models do not reproduce the claim ({len(not_below)} of {len(series)} "
        "time-series models)."
    )
