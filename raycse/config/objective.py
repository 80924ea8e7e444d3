"""The objective part of a run: its name and its knobs (typed by the objective's own ``Params``)."""

from __future__ import annotations

import typing
from dataclasses import dataclass
from typing import Optional

from raycse.config.fields import Section, detail, knob, one_of
from raycse.errors import ConfigError


@dataclass
class ObjectiveConfig(Section):
    """The objective's name plus its own knobs, checked by the objective's params class."""

    name: str = knob("simcse", '--objective',
                     "training objective: a name 'raycse objectives' lists, or a class of your own as "
                     "my_pkg.module:MyObjective (on PYTHONPATH; examples/symmetric_simcse.py)")
    params: dict = detail({},
                          "the objective's own knobs (see 'raycse objectives'); objective.KNOB is short for "
                          'objective.params.KNOB')
    matryoshka_dims: Optional[list] = knob(None, '--matryoshka-dims',
                                           'train the objective on each nested prefix of the embedding too (Matryoshka'
                                           ', Kusupati et al. 2022), e.g. 384,256,128,64: the loss summed over the '
                                           're-normalised prefixes (default: off)')
    matryoshka_weights: Optional[list] = detail(None,
                                                'one weight per size of objective.matryoshka_dims (default: 1 each)')
    distill: str = knob("kl", '--distill',
                        "with --teacher: the distillation term, kl (the teacher's softmax over each anchor's in-batch "
                        "similarities as the student's target) | mse (the teacher's embedding, equal sizes only) | "
                        "margin_mse (the teacher's positive-minus-negative margin, pairs with hard negatives)")
    distill_weight: float = knob(1.0, '--distill-weight',
                                 "with --teacher: the distillation term's weight w in L = L_objective + w L_distill; 0 "
                                 "leaves the teacher out (a search's 'no teacher' choice)")
    distill_tau: float = detail(0.05, "with --teacher and distill kl: the temperature of the student's softmax")
    teacher_tau: float = detail(0.05, "with --teacher and distill kl: the temperature of the teacher's softmax")
    guide_margin: float = knob(0.0, '--guide-margin',
                               "with --guide: GISTEmbed's margin m; a negative the guide scores above the positive "
                               "less m is masked")
    # objective knobs with a flag of their own (flag, knob, type, help); the others go through --set
    PARAM_FLAGS: typing.ClassVar[tuple] = (
        ("--tau", "tau", float, "InfoNCE temperature (default: the objective's own, 0.05 for simcse)"),)

    def validate(self) -> None:
        from raycse.objectives.distill import KINDS

        self.typed()
        one_of("objective.distill", self.distill, KINDS)
        for key in ("distill_tau", "teacher_tau"):
            if not getattr(self, key) > 0:
                raise ConfigError(f"objective.{key} must be > 0, got {getattr(self, key)}")
        for key in ("distill_weight", "guide_margin"):
            if not getattr(self, key) >= 0:
                raise ConfigError(f"objective.{key} must be >= 0, got {getattr(self, key)}")
        if self.matryoshka_dims is not None or self.matryoshka_weights is not None:
            self.build()  # (sizes, weights, and whether the objective can be wrapped)

    def matryoshka(self):
        """The Matryoshka sizes and weights (raycse.objectives.matryoshka.MatryoshkaSpec), or None."""
        from raycse.objectives.matryoshka import MatryoshkaSpec

        if self.matryoshka_dims is None:
            if self.matryoshka_weights is not None:
                raise ConfigError("objective.matryoshka_weights needs objective.matryoshka_dims")
            return None
        return MatryoshkaSpec.build(self.matryoshka_dims, self.matryoshka_weights)

    def build(self, teacher: bool = False, guide: bool = False):
        """The objective to train: the named one with its knobs, inside Matryoshka where asked for, inside
        a teacher's term and a guide's mask where the run has them (model.teacher, model.guide)."""
        from raycse.objectives.matryoshka import Matryoshka
        from raycse.objectives.references import WithReferences
        from raycse.objectives.registry import get

        objective = get(self.name)(self.typed())
        spec = self.matryoshka()
        objective = Matryoshka(objective, spec) if spec else objective
        references = self.references(teacher, guide)
        return WithReferences(objective, references) if references else objective

    def distills(self, teacher) -> bool:
        """Whether a run with ``teacher`` (model.teacher) has a teacher's term: one weighted 0 is none (a
        search's "no teacher" choice), nothing embedded and the teacher not loaded."""
        return bool(teacher) and self.distill_weight > 0

    def references(self, teacher: bool, guide: bool):
        """What a teacher and a guide add (raycse.objectives.references.ReferenceSpec), or None without them
        (a teacher weighted 0 is none)."""
        from raycse.objectives.references import ReferenceSpec

        teacher = self.distills(teacher)
        if not (teacher or guide):
            return None
        return ReferenceSpec(self.distill if teacher else None, self.distill_weight, self.distill_tau, self.teacher_tau,
                             guide, self.guide_margin)

    def typed(self):
        """The knobs as the objective's own typed ``Params`` (coerced, range-checked): parsed once for
        the current name and params, which stay a plain mapping for YAML, flags and search spaces."""
        from raycse.objectives.registry import build_params

        key = (self.name, repr(sorted(self.params.items())))
        cached = self.__dict__.get("_typed")
        if cached is None or cached[0] != key:
            cached = (key, build_params(self.name, self.params))
            self.__dict__["_typed"] = cached  # (not a field: to_dict and equality ignore it)
        return cached[1]


# the objective section's own settings, beside its name and the objective's knobs (objective.KNOB)
OWN_SETTINGS = ("matryoshka_dims", "matryoshka_weights", "distill", "distill_weight", "distill_tau", "teacher_tau",
                "guide_margin")
