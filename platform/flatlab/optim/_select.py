"""IRE's exact selection of its flat coordinates (private module): the k-th smallest of the squared-gradient
estimates over every trainable tensor, exactly as ``torch.kthvalue`` of their concatenation gives it (ties
and zeros included) but without ever materialising that vector, and the count of entries at most a bound.

Two algorithms, one result: a radix select over the float32 bit patterns in bounded pieces (every device;
:func:`radix_kth_smallest_with_count`) and, on the CPU, a sampled bracket that narrows the search to the few
values around the k-th before one exact pass (:func:`kth_smallest_with_count`); :func:`at_most` marks the
entries at most a bound. :func:`square_tie_ceiling` turns a threshold on squares into one on magnitudes
(ties at the threshold count as flat). One algorithm kept whole: the threshold of IRE's mask refresh
(``docs/algorithms/ire.md``).
"""

from __future__ import annotations

import math
from typing import Any, Callable, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch

from flatlab.optim._subnormal import ieee_subnormals

Number = Union[float, int]


# Entries per piece of the radix select and of the mask comparisons (:func:`at_most`): their temporaries
# (two 4-byte scratch pieces, 2 MB each, and histograms of at most 2^17 int64 bins, 1 MB) stay below
# about 6 MB whatever the number of values.
SELECT_CHUNK = 1 << 19

# int32 bit patterns: the sign bit cleared (|x|), and the number of values of the lower 16 bits
_MAGNITUDE_BITS = 0x7FFFFFFF
_LOW = 1 << 16


def kth_smallest_nonnegative(values: Union[torch.Tensor, Sequence[torch.Tensor]], k: int) -> torch.Tensor:
    """The ``k``-th smallest entry (1-based) of float32 NON-NEGATIVE values (one tensor or several).

    Exactly ``torch.kthvalue(values, k).values`` (same value, ties and zeros included); see
    :func:`kth_smallest_with_count`, which also returns how many entries are ≤ it.
    """
    return kth_smallest_with_count(values, k)[0]


def _magnitude_bits(values: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    # The int32 bit patterns of |values|: 0 .. 0x7F800000 for finite values and +inf, NaNs above
    # (non-negative float32 numbers order like these integers). float32 values: written into ``out`` with
    # the sign bit cleared; int32 values are such patterns already and are returned as they are.
    if values.dtype == torch.int32:
        return values
    return torch.bitwise_and(values.view(torch.int32), _MAGNITUDE_BITS, out=out)


def _batches(pieces: Sequence[torch.Tensor]) -> List[List[torch.Tensor]]:
    # Consecutive pieces (each of at most SELECT_CHUNK entries) grouped into runs of at most SELECT_CHUNK
    # entries in all: each run is binned into one scratch piece and counted by ONE bincount, so small
    # tensors (biases, norms) do not each pay for a histogram
    out: List[List[torch.Tensor]] = []
    size = SELECT_CHUNK
    for part in pieces:
        if size + part.numel() > SELECT_CHUNK:
            out.append([])
            size = 0
        out[-1].append(part)
        size += part.numel()
    return out


def _binned(
    batch: Sequence[torch.Tensor],
    scratch: torch.Tensor,
    spare: torch.Tensor,
    fill: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], Any],
) -> torch.Tensor:
    # the run's pieces laid end to end from the scratch's start, each written by fill(piece, its slice, the
    # same slice of the spare scratch); returns the filled part of the scratch (the run's bins, counted by
    # one bincount)
    at = 0
    for part in batch:
        fill(part, scratch[at : at + part.numel()], spare[at : at + part.numel()])
        at += part.numel()
    return scratch[:at]


def _add_counts(hist: Optional[torch.Tensor], bins: torch.Tensor, size: int) -> torch.Tensor:
    counts = torch.bincount(bins, minlength=size)
    return counts if hist is None else hist.add_(counts)


def _checked(
    values: Union[torch.Tensor, Sequence[torch.Tensor]], k: int
) -> Tuple[List[torch.Tensor], int, torch.device]:
    # the values as flat contiguous views, their number and device, after the checks both selects share
    tensors = [values] if isinstance(values, torch.Tensor) else list(values)
    if not tensors or any(t.dtype not in (torch.float32, torch.int32) for t in tensors):
        raise ValueError(
            "kth_smallest_nonnegative: values must be float32 tensors (or int32 bit patterns), got "
            + (", ".join(f"{tuple(t.shape)} {t.dtype}" for t in tensors) or "none")
        )
    device = tensors[0].device
    if any(t.device != device for t in tensors):
        raise ValueError("kth_smallest_nonnegative: all values must be on one device")
    flats = [t.contiguous().view(-1) for t in tensors]
    n = sum(f.numel() for f in flats)
    if not 1 <= k <= n:
        raise ValueError(f"kth_smallest_nonnegative: k must be in [1, {n}], got {k}")
    return flats, n, device


def kth_smallest_with_count(values: Union[torch.Tensor, Sequence[torch.Tensor]], k: int) -> Tuple[torch.Tensor, int]:
    """``(v, c)``: the ``k``-th smallest entry ``v`` (1-based) of float32 NON-NEGATIVE values, and the
    number ``c ≥ k`` of entries ≤ ``v`` (ties with ``v`` included).

    ``values`` is one tensor or a sequence of tensors (any shapes) ranked together, as if flattened
    and concatenated, without building that concatenation. ``v`` is exactly
    ``torch.kthvalue(torch.cat([t.flatten() for t in values]), k).values`` and ``c`` equals the number of
    entries ``<= v`` whenever ``v`` is not NaN. Non-negative IEEE-754 float32 numbers order like their bit
    patterns read as integers, so both methods work on those patterns: on the CPU a sampled bracket
    (:func:`_bracketed_select`), which hands over to the radix select where it gives up; elsewhere (CUDA)
    the radix select (:func:`radix_kth_smallest_with_count`). Both work through bounded scratch (pieces of
    at most ``SELECT_CHUNK`` entries), whatever the number of values and however many share the k-th value.

    Args:
        values: float32 tensor(s), every entry ≥ 0 (squares, or EMAs of squares), all on one device.
            Signs are ignored (``-0.0`` counts as 0; NaN, of either sign, ranks above +inf), so a
            diverging step never makes the selection itself fail. int32 tensors are taken as the bit
            patterns of such numbers with the sign bit already clear (``x.view(torch.int32)`` of
            magnitudes), which saves clearing it in each pass; the value returned is still float32.
        k: rank, ``1 ≤ k ≤ n`` with n the total number of entries.
    Returns:
        0-d float32 tensor on the values' device, and the count as a Python int (host reads, as the
        select already needs).
    Raises:
        ValueError: a tensor that is not float32 or int32, tensors on several devices, or ``k`` outside
            ``[1, n]``.
        RuntimeError: an int32 entry is negative (checked by the CPU select; ``torch.bincount``'s error
            elsewhere).
    """
    flats, n, device = _checked(values, k)
    if device.type == "cpu":
        found = _bracketed_select(flats, k, n)
        if found is not None:
            return found
    return _radix_select(flats, k, n)


def radix_kth_smallest_with_count(
    values: Union[torch.Tensor, Sequence[torch.Tensor]], k: int
) -> Tuple[torch.Tensor, int]:
    """:func:`kth_smallest_with_count` by the radix select alone, on any device (the answer is the same).

    Two-pass radix select on the bit patterns: a histogram of the upper 16 bits finds the bucket holding
    the k-th value, then one histogram over all entries, of the lower 16 bits inside that bucket (the
    entries outside it binned apart, spread over as many bins), finds the value itself and ``c``. Every
    pass is integer arithmetic (bit-and, shift, subtract, clamp) and ``torch.bincount``; no comparison
    mask is built and no entries are gathered (both are slow in torch on the CPU); ``bench/select_cost.py``
    and ``bench/gpu_check.py`` time it against ``kthvalue``. Both passes run over pieces of at most
    ``SELECT_CHUNK`` entries through two
    int32 scratch pieces; consecutive small tensors are binned side by side into that scratch and
    counted together (one ``bincount`` per run of at most ``SELECT_CHUNK`` entries, not one per tensor).

    Args, returns and raises: as :func:`kth_smallest_with_count`.
    """
    flats, n, _ = _checked(values, k)
    return _radix_select(flats, k, n)


def _radix_select(flats: Sequence[torch.Tensor], k: int, n: int) -> Tuple[torch.Tensor, int]:
    device = flats[0].device
    batches = _batches([part for f in flats for part in f.split(SELECT_CHUNK)])
    size = max(sum(p.numel() for p in b) for b in batches)
    scratch = torch.empty(size, dtype=torch.int32, device=device)
    spare = torch.empty(size, dtype=torch.int32, device=device)
    rank = torch.tensor([k], dtype=torch.int64, device=device)

    # First pass: histogram of the upper 16 bits (0 .. 0x7FFF).
    hist: Optional[torch.Tensor] = None
    for batch in batches:
        bins = _binned(
            batch,
            scratch,
            spare,
            lambda part, out, _: torch.bitwise_right_shift(_magnitude_bits(part, out), 16, out=out),
        )
        hist = _add_counts(hist, bins, 1 << 15)
    assert hist is not None
    cum = hist.cumsum_(0)
    bucket = int(torch.searchsorted(cum, rank))  # first bucket whose cumulative count reaches k
    below = int(cum[bucket - 1]) if bucket > 0 else 0  # entries in the buckets below it (fewer than k)

    # Second pass: an entry inside the bucket goes to bin (its lower 16 bits), any other entry to bin
    # 2^16 + (its lower 16 bits). The other entries' bins are thus spread over 2^16 bins: sending them
    # all to one bin (a clamp) makes bincount add to one counter over and over, several times slower on
    # the CPU.
    def fill(part: torch.Tensor, out: torch.Tensor, low: torch.Tensor) -> None:
        bits = _magnitude_bits(part, out)
        torch.bitwise_and(bits, _LOW - 1, out=low)
        torch.bitwise_right_shift(bits, 16, out=out)
        torch.ne(out, bucket, out=out)  # 1 outside the bucket, 0 inside
        torch.add(low, out, alpha=_LOW, out=out)

    hist = None
    for batch in batches:
        hist = _add_counts(hist, _binned(batch, scratch, spare, fill), 2 * _LOW)
    assert hist is not None
    del scratch, spare
    cum = hist[:_LOW].cumsum(0).add_(below)
    at = int(torch.searchsorted(cum, rank))  # the bucket holds the k-th entry: at < 2^16
    count = int(cum[at])
    value = torch.tensor((bucket << 16) | at, dtype=torch.int32, device=device).view(torch.float32)
    return value, count


# The CPU select (:func:`_bracketed_select`): up to _WHOLE entries are selected from a copy directly; above
# that a sample of _SAMPLE entries or more (up to _MAX_SAMPLE) places a bracket _SPREAD standard deviations
# of the sample's rank either side of the k-th
_WHOLE = 1 << 17
_SAMPLE = 1 << 15
_MAX_SAMPLE = 1 << 18
_SPREAD = 5.0
_GOLDEN = (5**0.5 - 1) / 2
_fractions = np.empty(0)  # i·φ mod 1 for i < len, grown on demand


def _spread_positions(size: int, count: int) -> np.ndarray:
    # ``count`` positions in [0, size) spread evenly and without a period (a Weyl sequence i·φ mod 1):
    # deterministic, no RNG drawn, and no stride that a weight matrix's rows could line up with
    global _fractions
    if _fractions.size < count:
        _fractions = np.arange(count, dtype=np.float64) * _GOLDEN % 1.0
    return (_fractions[:count] * size).astype(np.int64)


def _host_bits(flats: Sequence[torch.Tensor]) -> List[Tuple[np.ndarray, bool]]:
    # each tensor's int32 bit patterns as a numpy view (no copy), with whether its sign bits still need
    # clearing (float32 values) or are clear already (int32 keys, checked non-negative as bincount checks)
    out = []
    for f in flats:
        if f.dtype == torch.int32:
            bits = f.detach().numpy()
            if bits.size and int(bits.min()) < 0:
                raise RuntimeError("kth_smallest_nonnegative: int32 bit patterns must be non-negative")
            out.append((bits, False))
        else:
            out.append((f.detach().view(torch.int32).numpy(), True))
    return out


def _as_result(bits: int, count: int) -> Tuple[torch.Tensor, int]:
    return torch.tensor(bits, dtype=torch.int32).view(torch.float32), int(count)


def _sample_size(n: int) -> Optional[int]:
    # the smallest sample (a power of two from _SAMPLE) whose bracket, about 2·_SPREAD·½/√m of the entries
    # (q(1 − q) ≤ ¼), is expected to gather at most a quarter of SELECT_CHUNK; None above _MAX_SAMPLE
    m = _SAMPLE
    while n * _SPREAD / math.sqrt(m) > SELECT_CHUNK / 4:
        m *= 2
        if m > _MAX_SAMPLE:
            return None
    return m


def _bracketed_select(flats: Sequence[torch.Tensor], k: int, n: int) -> Optional[Tuple[torch.Tensor, int]]:
    """:func:`kth_smallest_with_count` on CPU tensors through a sampled bracket; ``None`` where it gives up.

    Up to ``_WHOLE`` entries: a copy of all of them, ``numpy.partition``-ed (introselect). Above: a
    sample of m entries (:func:`_sample_size`), spread over each tensor in proportion to its size, is
    sorted; its order statistics ``_SPREAD`` standard deviations of a sample rank either side of rank
    k·m/n give the bracket [lo, hi]. One pass over pieces of ``SELECT_CHUNK`` entries counts the entries
    below lo and in [lo, hi] and gathers the latter; the k-th is then the (k − below)-th of those
    (``numpy.partition``). Gives up when the k-th lies outside the bracket, or when the bracket holds
    more than 4x the entries the sample predicts (or more than ``SELECT_CHUNK``: a value tied over much
    of the data, where the introselect also slows down sharply), unless lo = hi, which needs no
    gathering; and up front for more entries than a sample of ``_MAX_SAMPLE`` can bracket narrowly
    enough (about 13 M). The sample decides only the time taken, never the answer.
    """
    arrays = _host_bits(flats)
    if n <= _WHOLE:
        every = np.concatenate([a.reshape(-1) for a, _ in arrays])
        if any(clear for _, clear in arrays):
            np.bitwise_and(every, _MAGNITUDE_BITS, out=every)
        every.partition(k - 1)
        bits = int(every[k - 1])
        return _as_result(bits, np.count_nonzero(every <= bits))
    m = _sample_size(n)
    if m is None:
        return None
    picked = []
    for a, clear in arrays:
        values = a[_spread_positions(a.size, min(a.size, max(1, round(m * a.size / n))))]
        picked.append(np.bitwise_and(values, _MAGNITUDE_BITS, out=values) if clear else values)
    sample = np.concatenate(picked)
    sample.sort()
    m = sample.size
    q = k / n
    reach = math.ceil(_SPREAD * math.sqrt(m * q * (1 - q))) + 2
    first, last = math.floor(q * m) - reach, math.ceil(q * m) + reach
    lo = int(sample[first]) if first >= 0 else 0
    hi = int(sample[last]) if last < m else _MAGNITUDE_BITS
    limit = min(SELECT_CHUNK, 4 * math.ceil(n * (min(last, m - 1) - max(first, 0) + 1) / m))

    below = inside = 0
    gathered: List[np.ndarray] = []
    piece = min(n, SELECT_CHUNK)
    magnitudes = np.empty(piece, dtype=np.int32)
    under, upto = np.empty(piece, dtype=bool), np.empty(piece, dtype=bool)
    for a, clear in arrays:
        for start in range(0, a.size, SELECT_CHUNK):
            part = a[start : start + SELECT_CHUNK]
            size = part.size
            if clear:
                part = np.bitwise_and(part, _MAGNITUDE_BITS, out=magnitudes[:size])
            lower = np.count_nonzero(np.less(part, lo, out=under[:size]))
            held = np.count_nonzero(np.less_equal(part, hi, out=upto[:size])) - lower
            below += lower
            inside += held
            if below >= k or (lo != hi and inside > limit):
                return None  # the k-th lies below the bracket, or the bracket is too full to gather
            if held and lo != hi:
                gathered.append(part[np.logical_xor(under[:size], upto[:size], out=under[:size])])
    if not below < k <= below + inside:
        return None  # the k-th lies above the bracket
    if lo == hi:
        return _as_result(lo, below + inside)
    candidates = np.concatenate(gathered)
    candidates.partition(k - below - 1)
    bits = int(candidates[k - below - 1])
    return _as_result(bits, below + np.count_nonzero(candidates <= bits))


def at_most(values: torch.Tensor, bound: Number, out: torch.Tensor) -> int:
    """``out ← values <= bound`` (a bool tensor shaped like ``values``); returns how many are set.

    ``values`` is compared in its own dtype (an int32 bit-pattern view compares as integers, float32 as
    IEEE numbers: NaN is never ≤). On the CPU numpy compares float32 and int32 values straight into ``out``
    and counts it (torch's comparison to bool, and its count of a bool tensor, are several times slower).
    Elsewhere, and for other dtypes, the comparison writes 0/1 in ``values``' dtype into a bounded
    scratch piece (at most ``SELECT_CHUNK`` entries) and converts that to bool. One host read (the count).

    Raises:
        ValueError: ``out`` is not a bool tensor with ``values``' number of entries.
    """
    if out.dtype != torch.bool or out.numel() != values.numel():
        raise ValueError(
            f"at_most: out must be a bool tensor of {values.numel()} entries, got {out.numel()} {out.dtype}"
        )
    src, dst = values.reshape(-1), out.view(-1)
    if src.numel() == 0:
        return 0
    if src.device.type == "cpu" and dst.device.type == "cpu" and src.dtype in (torch.float32, torch.int32):
        flags = np.less_equal(src.detach().numpy(), bound, out=dst.numpy())
        return int(np.count_nonzero(flags))
    return _at_most_in_pieces(src, bound, dst)


def _at_most_in_pieces(src: torch.Tensor, bound: Number, dst: torch.Tensor) -> int:
    # at_most off the CPU: flat src, flat bool dst of as many entries, compared in pieces (any device)
    scratch = torch.empty(min(src.numel(), SELECT_CHUNK), dtype=src.dtype, device=src.device)
    counts = []
    for a, b in zip(src.split(SELECT_CHUNK), dst.split(SELECT_CHUNK)):
        flags = torch.le(a, bound, out=scratch[: a.numel()])
        b.copy_(flags)
        counts.append(flags.sum(dtype=flags.dtype))  # exact: at most SELECT_CHUNK ones (float32: integers to 2^24)
    return int(torch.stack(counts).to(torch.int64).sum())


# Bit pattern of float32 +inf: non-negative float32 numbers order like their bit patterns read as int32,
# +inf last among the non-NaN ones.
F32_INF_BITS = 0x7F800000


def _f32_squares(bits: Sequence[int]) -> List[int]:
    # fl(x·x) of the non-negative float32 numbers with these bit patterns, as bit patterns: torch's
    # float32 multiply on the CPU (IEEE round-to-nearest-even, gradual underflow), a few numbers at once
    x = torch.tensor(list(bits), dtype=torch.int32).view(torch.float32)
    with ieee_subnormals():  # also on a thread that flushes them (a trial, IRE's step): squares as defined
        return torch.mul(x, x).view(torch.int32).tolist()


def square_tie_ceiling(value: torch.Tensor) -> int:
    """Bit pattern of the largest float32 ``x`` whose square rounds to at most ``value``'s square.

    With ``a = value`` (float32, ≥ 0) and fl(·) float32 rounding, returns the bits of
    ``G = max{x ≥ 0 : fl(x·x) ≤ fl(a·a)}``. As fl(x·x) is non-decreasing in x, for any float32 g,
    ``fl(g·g) ≤ fl(a·a)`` iff ``|g| ≤ G``: a threshold on squares becomes one on magnitudes, compared
    without squaring anything. G ≥ a; G > a where neighbours of a round to the same square, which is
    how ties arise: in the normal range at most a few ulps away, below 2^-63 ≈ 1.1e-19 (squares
    subnormal or 0) over wide ranges (every |g| ≤ 2^-75 squares to 0).

    Found on the host by squaring candidate bit patterns (a galloping round, then bisection in rounds
    of 63 candidates): a handful of torch calls on at most 63 numbers.

    Args:
        value: 0-d float32 tensor, ≥ 0 or +inf (a k-th smallest magnitude; any device).
    Returns:
        G's bit pattern as a Python int in ``[bits(a), F32_INF_BITS]`` (``F32_INF_BITS`` when a's square
        overflows to +inf: every non-NaN value is then at most it).
    Raises:
        ValueError: ``value`` is not a non-negative float32 number or +inf (NaN, negative, other dtype).
    """
    if value.dtype != torch.float32 or value.numel() != 1:
        raise ValueError(
            f"square_tie_ceiling: value must be one float32 number, got {tuple(value.shape)} {value.dtype}"
        )
    lo = int(value.reshape(()).view(torch.int32))
    if not 0 <= lo <= F32_INF_BITS:
        raise ValueError(f"square_tie_ceiling: value must be >= 0 and not NaN, got {float(value)}")
    bound = _f32_squares([lo])[0]
    # Invariant: fl(lo²) ≤ bound (lo is in the set); hi is None or the bits of a number outside it.
    # First round gallops (lo+1, lo+2, lo+4, …, +inf): ties in the normal range end within it.
    candidates = sorted({min(lo + (1 << j), F32_INF_BITS) for j in range(31)} | {F32_INF_BITS})
    hi: Optional[int] = None
    while candidates:
        inside = [c for c, sq in zip(candidates, _f32_squares(candidates)) if sq <= bound]  # a prefix: monotone
        if inside:
            lo = inside[-1]
        if len(inside) < len(candidates):
            hi = candidates[len(inside)]
        if hi is None:  # every candidate was inside, +inf included
            return lo
        width = hi - lo
        candidates = sorted({lo + (width * i) // 64 for i in range(1, 64)} - {lo})
    return lo
