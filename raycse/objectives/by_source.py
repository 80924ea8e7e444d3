"""A mixture's objective: each batch trained by the objective of the source it comes from (``data.sources``).

Every batch holds one source's rows (raycse.grouping.mixing), collated by that source's objective with the
batch's ``source`` (its index) beside its tensors; the forward is that objective's, so a batch's loss is exactly
the loss its source's objective gives it alone. The sources' objectives are modules of this one: parameters of
their own (SG-OPT's frozen copy, a learned tau) are each source's, and the encoder, optimizer and schedule are
shared.
"""

from __future__ import annotations

from torch import Tensor, nn

from raycse.objectives.base import LossOutput, Objective, Params

SOURCE = "source"  # the batch's key naming its source's index


class BySource(Objective):
    """``parts``: each source's objective, by name, in ``data.sources``' order."""

    name = "by_source"
    Params = Params

    def __init__(self, parts: dict):
        super().__init__(Params())
        self.parts = nn.ModuleDict(parts)
        self.names = list(parts)
        objectives = list(parts.values())
        # what holds of any of them holds of the mixture (a step's collate or widths may be any source's)
        self.collate_draws_random = any(o.collate_draws_random for o in objectives)
        self.derives_widths = any(o.derives_widths for o in objectives)
        self.sliceable = all(o.sliceable for o in objectives)

    def part(self, index: int) -> Objective:
        return self.parts[self.names[index]]

    def setup(self, encoder: nn.Module) -> None:
        for objective in self.parts.values():
            objective.setup(encoder)

    def collate_source(self, index: int, examples: list, tokenizer, max_length: int) -> dict[str, Tensor]:
        """Source ``index``'s batch of ``examples``, as its objective collates it, marked with its source."""
        batch = self.part(index).collate(examples, tokenizer, max_length)
        batch[SOURCE] = index  # (last: the objectives read a batch's size from its first tensor)
        return batch

    def collate(self, texts: list, tokenizer, max_length: int) -> dict[str, Tensor]:
        raise TypeError("a mixture's batch is collated by its source's objective: BySource.collate_source")

    def forward(self, encoder: nn.Module, batch: dict) -> LossOutput:
        rest = {k: v for k, v in batch.items() if k != SOURCE}  # (objectives take every entry as a tensor)
        return self.part(int(batch[SOURCE]))(encoder, rest)

    def custom_lr(self) -> dict[str, float]:
        return {f"parts.{name}.{k}": v for name, o in self.parts.items() for k, v in o.custom_lr().items()}

    def matryoshka_refusal(self):
        return next((f"source {n}: {r}" for n, o in self.parts.items() if (r := o.matryoshka_refusal())), None)

    def lora_refusal(self):
        return next((f"source {n}: {r}" for n, o in self.parts.items() if (r := o.lora_refusal())), None)

    def sharding_refusal(self):
        return next((f"source {n}: {r}" for n, o in self.parts.items() if (r := o.sharding_refusal())), None)
