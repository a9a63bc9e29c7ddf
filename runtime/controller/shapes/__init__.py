"""Steps that vary in shape: the plan of every shape bucket (``book``), the entry each step runs with
(``steps``), and, in the training process, the captured shapes, the step model and each step's shape
(``varying``)."""
