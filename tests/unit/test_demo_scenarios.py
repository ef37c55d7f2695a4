"""The demo's scenario texts follow the run's settings."""

import dataclasses

from specrag.demo import SCENARIOS, scenario_context
from specrag.graph.context import SpecRagContext


def test_every_intro_fills_in_and_names_the_settings_in_use():
    """The "no evidence" intro said threshold 0.2 whatever `--set relevance_threshold` said."""
    base = dataclasses.replace(SpecRagContext(), relevance_threshold=0.35)
    texts = {s.name: s.describe(scenario_context(base, s)) for s in SCENARIOS}
    assert all(texts.values()) and not any("{" in t for t in texts.values())
    assert "relevance_threshold 0.35 or more" in texts["no evidence"]
