"""Integrations: Ultralytics callbacks/trainer, the YOLOv5 hooks and patcher.

They say only *when* a phase begins and ends; the session applies it."""
