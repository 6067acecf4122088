"""Parameter grouping: which parameter names form one "layer".

Layer-wise interpolation and layer-wise sharpness (seed paper "In Search of the Successful
Interpolation", Def. 1.1 and App. A) act on one *layer* at a time, where a layer is a group of parameter
names, weights and biases together. CLIP is grouped by name, not by ``nn.Linear`` (attention's
``in_proj_weight`` is a bare parameter of ``nn.MultiheadAttention``).

A :class:`Grouping` is an ordered list of :class:`GroupRule`; the first rule that matches a parameter
name assigns it. Parameters no rule matches are handled by ``Grouping.unmatched``:

* ``"module"`` (default): one group per owning module (the name without its last component), i.e.
  each leaf module that owns parameters; a root-level parameter forms its own group;
* ``"other"``: one group named ``other``;
* ``"ignore"``: left out;
* ``"error"``: :class:`~flatlab.errors.ConfigError` listing them.

Ready groupings (:data:`GROUPINGS`, see :func:`get_grouping`): ``clip``, ``vit`` (timm naming) and
``modules`` (no rules: each leaf module that owns parameters).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

from torch import nn

from flatlab.errors import ConfigError, UnknownNameError
from flatlab.registry import Registry

UNMATCHED_POLICIES = ("module", "other", "ignore", "error")
REGEX_PREFIX = "re:"

Groups = Dict[str, Tuple[str, ...]]
"""Group name -> parameter names, both in first-appearance order of ``named_parameters()``."""


@dataclass(frozen=True)
class GroupRule:
    """Parameters whose names match ``pattern`` belong to the group ``name``.

    Attributes:
        pattern: a dotted name prefix (``visual.conv1`` matches ``visual.conv1.weight`` and
            ``visual.conv1``, not ``visual.conv10.weight``), or with ``regex=True`` a regular
            expression matched at the start of the name (``re.match``) that must end at a ``.`` or at
            the end of the name.
        name: group name. ``None`` (default): the matched text, e.g. ``visual.transformer.resblocks.3``.
            For a regex it may use ``{0}``, ``{1}``... (capture groups, ``""`` when unset) and ``{match}``.
        regex: interpret ``pattern`` as a regular expression.

    Raises:
        ConfigError: an empty pattern or name, or a regex that does not compile.
    """

    pattern: str
    name: Optional[str] = None
    regex: bool = False
    _compiled: "re.Pattern[str]" = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.pattern, str) or not self.pattern:
            raise ConfigError(f"a group rule needs a non-empty pattern; got {self.pattern!r}")
        if self.name is not None and (not isinstance(self.name, str) or not self.name.strip()):
            raise ConfigError(
                f"group rule {self.pattern!r}: the group name must be a non-empty string or None; got {self.name!r}"
            )
        source = self.pattern if self.regex else re.escape(self.pattern)
        try:
            compiled = re.compile(f"(?:{source})(?=\\.|$)")
        except re.error as exc:
            raise ConfigError(f"group rule {self.pattern!r} is not a valid regular expression: {exc}") from None
        object.__setattr__(self, "_compiled", compiled)

    def match(self, param_name: str) -> Optional[str]:
        """The group name for ``param_name``, or ``None`` if the rule does not match."""
        m = self._compiled.match(param_name)
        if m is None:
            return None
        if self.name is None:
            return m.group(0)
        return self.name.format(*(g or "" for g in m.groups()), match=m.group(0))


@dataclass(frozen=True)
class Grouping:
    """An ordered rule list plus a policy for unmatched parameters (module docstring).

    Attributes:
        rules: tried in order; the first match wins.
        unmatched: ``"module"``, ``"other"``, ``"ignore"`` or ``"error"``.
        name: label used in messages.
    """

    rules: Tuple[GroupRule, ...] = ()
    unmatched: str = "module"
    name: str = "custom"

    def __post_init__(self) -> None:
        object.__setattr__(self, "rules", tuple(self.rules))
        if self.unmatched not in UNMATCHED_POLICIES:
            raise ConfigError(
                f"unmatched={self.unmatched!r} is not allowed; "
                f"expected one of {', '.join(map(repr, UNMATCHED_POLICIES))}"
            )
        for rule in self.rules:
            if not isinstance(rule, GroupRule):
                raise ConfigError(f"grouping {self.name!r}: rules must be GroupRule instances; got {rule!r}")

    @classmethod
    def from_pairs(
        cls, pairs: Iterable[Sequence[str]], *, unmatched: str = "module", name: str = "custom"
    ) -> "Grouping":
        """Build from ``[(group_name, pattern), ...]`` as written in a study file.

        ``pattern`` is a dotted prefix, or a regex when it starts with ``re:`` (``"re:blocks\\.(\\d+)"``);
        ``group_name`` may be ``""``/``None`` to use the matched text, and may use ``{0}``... for regexes.

        Raises:
            ConfigError: a pair that is not two strings, or an invalid rule.
        """
        rules = []
        for i, pair in enumerate(pairs):
            if isinstance(pair, str) or len(pair) != 2:
                raise ConfigError(f"grouping rule {i} must be a (group name, pattern) pair; got {pair!r}")
            group, pattern = pair
            if not isinstance(pattern, str):
                raise ConfigError(f"grouping rule {i}: the pattern must be a string; got {pattern!r}")
            regex = pattern.startswith(REGEX_PREFIX)
            rules.append(GroupRule(pattern[len(REGEX_PREFIX) :] if regex else pattern, group or None, regex))
        return cls(tuple(rules), unmatched=unmatched, name=name)

    def assign(self, param_names: Iterable[str]) -> Groups:
        """Group ``param_names`` (order kept; each name in exactly one group unless ignored).

        Raises:
            ConfigError: ``unmatched="error"`` and some names match no rule (they are listed).
        """
        groups: Dict[str, List[str]] = {}
        missing: List[str] = []
        for pname in param_names:
            group = None
            for rule in self.rules:
                group = rule.match(pname)
                if group is not None:
                    break
            if group is None:
                if self.unmatched == "module":
                    group = pname.rpartition(".")[0] or pname
                elif self.unmatched == "other":
                    group = "other"
                elif self.unmatched == "ignore":
                    continue
                else:
                    missing.append(pname)
                    continue
            groups.setdefault(group, []).append(pname)
        if missing:
            raise ConfigError(
                f"grouping {self.name!r}: {len(missing)} parameter(s) match no rule: {', '.join(missing[:10])}"
                + (" ..." if len(missing) > 10 else "")
                + "; add a rule or use unmatched='module'|'other'|'ignore'"
            )
        return {g: tuple(names) for g, names in groups.items()}


_ANY_PREFIX = r"(?:.*\.)?"  # tolerate wrappers such as ``model.`` or ``image_encoder.model.``


def clip_grouping() -> Grouping:
    """CLIP (OpenAI / open_clip naming): one group per transformer block, embedding, ``ln_*``, projection.

    Groups (names are the matched prefixes; an outer wrapper prefix is kept):
    each ``visual.transformer.resblocks.{i}`` and text ``transformer.resblocks.{i}``; ``visual.conv1``,
    ``visual.class_embedding``, ``visual.positional_embedding``, ``token_embedding``,
    ``positional_embedding``; each ``ln_*`` norm outside the blocks (``visual.ln_pre``,
    ``visual.ln_post``, ``ln_final``); ``visual.proj``; ``text_projection``; ``logit_scale``. Anything
    else (a classification head, ``visual.attn_pool`` ...) forms one group per owning module.
    """
    patterns = [
        r"visual\.transformer\.resblocks\.\d+",
        r"transformer\.resblocks\.\d+",
        r"visual\.conv1",
        r"visual\.class_embedding",
        r"visual\.positional_embedding",
        r"token_embedding",
        r"positional_embedding",
        r"(?:visual\.)?ln_[^.]+",
        r"visual\.proj",
        r"text_projection",
        r"logit_scale",
    ]
    return Grouping(tuple(GroupRule(_ANY_PREFIX + p, regex=True) for p in patterns), unmatched="module", name="clip")


def vit_grouping() -> Grouping:
    """ViT with timm naming: each ``blocks.{i}``, ``patch_embed``, ``cls_token``, ``pos_embed``,
    ``norm``/``fc_norm``, ``head``; anything else one group per owning module."""
    patterns = [r"blocks\.\d+", r"patch_embed", r"cls_token", r"reg_token", r"pos_embed", r"fc_norm", r"norm", r"head"]
    return Grouping(tuple(GroupRule(_ANY_PREFIX + p, regex=True) for p in patterns), unmatched="module", name="vit")


def module_grouping() -> Grouping:
    """Plain networks: each leaf module that owns parameters is one group (weights and biases together)."""
    return Grouping((), unmatched="module", name="modules")


GROUPINGS: Registry[Callable[[], Grouping]] = Registry("grouping")
GROUPINGS.register("clip", clip_grouping)
GROUPINGS.register("vit", vit_grouping)
GROUPINGS.register("modules", module_grouping)

GroupingLike = Union[str, Grouping]


def get_grouping(grouping: GroupingLike) -> Grouping:
    """A :class:`Grouping` from a registered name (``clip``, ``vit``, ``modules``) or itself.

    Raises:
        UnknownNameError: an unregistered name (the message lists the registered ones).
    """
    if isinstance(grouping, Grouping):
        return grouping
    if not isinstance(grouping, str):
        raise ConfigError(f"grouping must be a registered name or a Grouping; got {type(grouping).__name__}")
    return GROUPINGS.get(grouping)()


def group_parameters(model: Union[nn.Module, Iterable[str]], grouping: GroupingLike = "modules") -> Groups:
    """Group the floating-point parameters of ``model`` (or an iterable of parameter/state-dict names).

    Returns:
        ``{group name: (parameter names...)}`` in order of first appearance.

    Raises:
        UnknownNameError: unknown grouping name. ConfigError: see :meth:`Grouping.assign`.
    """
    if isinstance(model, nn.Module):
        names: Iterable[str] = [n for n, p in model.named_parameters() if p.is_floating_point()]
    else:
        names = model
    return get_grouping(grouping).assign(names)


def select_group(groups: Mapping[str, Sequence[str]], name: str) -> Tuple[str, ...]:
    """The parameter names of group ``name``.

    Raises:
        ConfigError: an empty group name (the message lists the valid ones).
        UnknownNameError: a name that is not a (non-empty) group (the message lists the valid ones).
    """
    valid = ", ".join(groups) or "(none)"
    if not isinstance(name, str) or not name:
        raise ConfigError(f"a group name must be a non-empty string; got {name!r}; valid groups: {valid}")
    if name not in groups or not groups[name]:
        raise UnknownNameError(f"unknown group {name!r}; valid groups: {valid}")
    return tuple(groups[name])


def keys_of(groups: Mapping[str, Sequence[str]], names: Iterable[str]) -> Tuple[str, ...]:
    """The parameter names of several groups, concatenated (each group checked by :func:`select_group`)."""
    out: List[str] = []
    for name in names:
        out.extend(select_group(groups, name))
    return tuple(dict.fromkeys(out))
