"""The controller's data model, the bottom layer: the plan or policy it runs (``plan``) and the step's clock
changes and requests on its expected timeline (``step_plan``), the run summary's records (``run_summary``) and their
JSON form (``json_form``). Imports no other room of the controller."""
