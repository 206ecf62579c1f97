"""What a user launches: configs, converters, the DeepSpeed trainer under Ray Train, evaluation, CLI."""
