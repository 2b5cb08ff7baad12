"""One module per RL trainer that draftkit plugs into (`trl`: TRL's GRPOTrainer). Each is the
only place that imports its trainer, which is an optional extra (`pip install 'draftkit[trl]'`)."""
