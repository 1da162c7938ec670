"""Metric trackers (plugin kind ``tracker``): console and JSONL built in."""
