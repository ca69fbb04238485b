"""What a parent does with its children: the control plane, supervision, the pipeline."""

__all__: list[str] = []
