"""Flows from data: taskflow's own flow specs (``spec``, ``load_spec``) and
Conductor workflow definitions ([`taskflow.declare.conductor`][taskflow.declare.conductor], also ``taskflow.conductor``).
Both compile to the same nodes a flow written in code uses and run through the facade.
"""
