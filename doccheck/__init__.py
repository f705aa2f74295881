"""Documentation in, verdicts with evidence out: the console's UI inventory (crawled), pages of
documentation read into procedures, the static check of each step against the inventory, a
verifiable task drafted from each procedure, and a verdict per procedure. See README.md.

This module is the checker's public surface: the packages above it (the jobs API, the
composition root) import from ``doccheck`` only, never from its modules (a test in
``tests/unit/test_layers.py`` holds them to it). Benchmarks and tests may reach inside."""
from .inventory import diff_main as inventory_diff_main
from .inventory import labels_by_drift
from .model import VERDICTS, Procedure, StepCheck, Verdict, from_json, to_json
from .replay import CONDITIONAL as REPLAY_CONDITIONAL
from .service import (CONTENT_TYPES, MAX_PAGE_BYTES, MAX_PAGES, DocsInputError, DocsService,
                      DocsUnavailable, PageIn, PageResult, ProcedureResult)
from .verdict import Rollout, procedure_verdict

__all__ = ["CONTENT_TYPES", "MAX_PAGES", "MAX_PAGE_BYTES", "REPLAY_CONDITIONAL", "VERDICTS",
           "DocsInputError",
           "DocsService", "DocsUnavailable", "PageIn", "PageResult", "Procedure",
           "ProcedureResult", "Rollout", "StepCheck", "Verdict", "from_json",
           "inventory_diff_main", "labels_by_drift", "procedure_verdict", "to_json"]
