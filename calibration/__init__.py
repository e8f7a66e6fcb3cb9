"""Calibration scoring of causal LMs on MMLU, ARC-Easy and HellaSwag.

Modules, in the order data flows: ``common.datasource`` (local root or hub) -> ``tasks`` (questions) -> ``prompts``
and ``task_config`` (lm-eval formats, k-shot) -> ``requests`` (token rows under shared prefixes) -> ``scoring``
(KV-cached log-likelihoods) -> ``records`` (per-question table) -> ``probabilities``, ``metrics``,
``bootstrap``, ``temperature`` -> ``summary``, ``reliability``, ``report``. Entry points: ``evaluate``
(``evaluate_model`` and its CLI), ``rescore`` (CLI, no model), ``agreement`` (check against lm-eval).
"""
