"""The nodes a Conductor task becomes, one module per family of task types.

``base`` (what every task shares), ``flow`` (SIMPLE, NOOP, DYNAMIC, forks, joins, switches),
``javascript`` (INLINE, LAMBDA and the JavaScript evaluators), ``jq`` (JSON_JQ_TRANSFORM),
``http`` (HTTP), ``control`` (SET_VARIABLE, TERMINATE, WAIT, EVENT) and ``nested`` (DO_WHILE,
SUB_WORKFLOW).
"""
