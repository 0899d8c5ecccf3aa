"""Tests of llmitm.observe: health answers and metric definitions."""
