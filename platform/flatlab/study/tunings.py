"""Independent tunings: every arm searched ``S`` times (``Study(tunings=S)``), each tuning with its own
Optuna study and sampler seed, its own trial seeds, its own ASHA rungs, its own best configuration and
its own final seeds, so that a comparison can take the tuning as its unit of replication (AlgoPerf's
independent studies per workload; Bouthillier et al., MLSys 2021).

Inside a launch a tuning is a *lane* of the search, ``(arm, k)`` for ``k`` in 1..S, named by
:func:`lane`: the arm itself for tuning 1 and ``<arm>@<k>`` after it (``@`` is not allowed in an arm's
name). Tuning 1 is exactly a single-tuning study: the same seeds, Optuna study names and sampler seeds.
Tuning ``k`` shifts every trial seed, final seed and sampler seed by ``(k - 1) * TUNING_STRIDE``
(modulo 2**32), so ``seeds=(0, 1)`` reads back as 0, 1 in tuning 1 and 1000000, 1000001 in tuning 2.
The data split and the measures' fixed subset and noise (``seed``, ``measure_seed``) are the study's
and do not change with the tuning: they are the instrument, not the search.
"""

from __future__ import annotations

from typing import Any, Iterable, List, Mapping, Tuple

from flatlab.analysis.sample import TUNING_KEY

TUNING_STRIDE = 1_000_000
"""How far tuning k's seeds lie from tuning 1's: ``(k - 1) * TUNING_STRIDE`` (modulo 2**32)."""
SEED_LIMIT = 2**32
LANE_SEP = "@"


def tuning_seed(seed: int, tuning: int) -> int:
    """Tuning ``tuning``'s version of ``seed`` (a trial, final or sampler seed): ``seed`` itself for
    tuning 1, shifted by ``(tuning - 1) * TUNING_STRIDE`` modulo 2**32 after it."""
    return (int(seed) + (int(tuning) - 1) * TUNING_STRIDE) % SEED_LIMIT


def tuning_seeds(seeds: Iterable[int], tuning: int) -> Tuple[int, ...]:
    """:func:`tuning_seed` of each of ``seeds``, in order."""
    return tuple(tuning_seed(s, tuning) for s in seeds)


def with_tuning(config: Mapping[str, Any], tuning: int, tunings: int) -> dict:
    """``config`` with its tuning under :data:`~flatlab.analysis.sample.TUNING_KEY` in a study of several
    tunings; unchanged (tuning 1 implied) in a study of one, whose trial configs stay as they always were."""
    return {**config, TUNING_KEY: int(tuning)} if int(tunings) > 1 else dict(config)


def lane(arm: str, tuning: int) -> str:
    """The name of arm ``arm``'s tuning ``tuning`` inside a launch: ``arm`` for tuning 1, ``arm@k`` after."""
    return arm if int(tuning) == 1 else f"{arm}{LANE_SEP}{int(tuning)}"


def lane_of(config: Mapping[str, Any]) -> str:
    """The lane of a trial config (its ``arm`` and ``tuning``; tuning 1 where the config has none)."""
    return lane(str(config.get("arm")), int(config.get(TUNING_KEY, 1)))


def lanes(arms: Iterable[str], tunings: int) -> List[str]:
    """Every lane of a launch, tuning-major: all arms of tuning 1, then of tuning 2, ..."""
    names = list(arms)
    return [lane(a, k) for k in range(1, int(tunings) + 1) for a in names]


def study_lanes(study: Any) -> List[str]:
    """Every lane of a :class:`~flatlab.study.spec.Study` (its arms' names, ``tunings`` times)."""
    return lanes([a.name for a in study.arms], getattr(study, "tunings", 1))


def split_lane(name: str) -> Tuple[str, int]:
    """``(arm, tuning)`` of a lane's name (the inverse of :func:`lane`)."""
    arm, sep, k = name.rpartition(LANE_SEP)
    return (arm, int(k)) if sep and k.isdigit() else (name, 1)


def overlapping_seeds(seeds: Iterable[int], tunings: int) -> List[int]:
    """The seeds that two tunings would share (their shifted sets intersect): empty when every tuning's
    trials are seeded apart."""
    base = list(seeds)
    seen: dict = {}
    shared = set()
    for k in range(1, int(tunings) + 1):
        for s in base:
            derived = tuning_seed(s, k)
            if derived in seen and seen[derived] != k:
                shared.add(derived)
            seen.setdefault(derived, k)
    return sorted(shared)
