"""What llmitm tells an operator about itself: health answers, metrics and traces (sans-IO)."""
