"""What several test modules share: the openai SDK oracle, the real-traffic fixtures, a Codex-style
stream parser and request validators."""
