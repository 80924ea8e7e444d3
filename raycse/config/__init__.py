"""Run configuration: one dataclass per part of a run, loaded from YAML and/or CLI flags.

One module per part, in the data flow's order: ``model``, ``data``, ``grouping``, ``objective``, ``train``
(itself split by concern: scaling, optimiser, precision, checkpoints, failures and start, tracking) and
``evaluation``; ``run`` joins them, ``fields`` holds what they are made of and ``files`` reads the YAML.

Every field is validated up front (:meth:`RunConfig.validate`) so that a bad value fails before Ray
starts, with one line naming the key and the accepted range; a fit trains the resolved run
(:meth:`RunConfig.resolved`: validated and frozen). Objective knobs live in the objective's own params
dataclass (see ``raycse.objectives.registry``) so that a new objective adds its knobs without touching
this package.
"""

from raycse.config.data import CORPUS_FORMATS, DECODE_POLICIES, DataConfig
from raycse.config.evaluation import DATA_ENV, STSB_DEV_IN_DATA, EvalConfig
from raycse.config.fields import PRECISIONS, Section, knob, setting
from raycse.config.files import MAX_YAML_DEPTH, RECIPES, YamlLoader, load_yaml, recipe, shipped
from raycse.config.grouping import KNN_SEARCH, STRATEGIES, GroupingConfig
from raycse.config.model import MLP_MODES, POOLINGS, TRUST_REMOTE_CODE, ModelConfig
from raycse.config.objective import ObjectiveConfig
from raycse.config.run import RunConfig, flag_fields, get_dotted, set_dotted, unflagged_fields
from raycse.config.train import (CheckpointSettings, FailureSettings, OptimizerSettings, PrecisionSettings,
                                 ScalingSettings, TrackingSettings, TrainConfig, parse_tracking)

__all__ = [
    "TRUST_REMOTE_CODE",
    "CORPUS_FORMATS", "DECODE_POLICIES", "DataConfig", "DATA_ENV", "STSB_DEV_IN_DATA", "EvalConfig",
    "PRECISIONS", "Section", "knob", "setting", "MAX_YAML_DEPTH", "RECIPES", "YamlLoader", "load_yaml",
    "recipe", "shipped", "STRATEGIES", "KNN_SEARCH", "GroupingConfig", "MLP_MODES", "POOLINGS", "ModelConfig",
    "ObjectiveConfig", "RunConfig", "flag_fields", "get_dotted", "set_dotted", "CheckpointSettings",
    "FailureSettings", "OptimizerSettings", "PrecisionSettings", "ScalingSettings", "TrackingSettings",
    "TrainConfig", "parse_tracking", "unflagged_fields",
]
