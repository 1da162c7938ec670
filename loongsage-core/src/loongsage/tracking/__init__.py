"""Metric trackers (plugin kind ``tracker``): console, JSONL, TensorBoard, W&B and MLflow built in."""
