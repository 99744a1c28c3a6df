"""What the toolkit adds to verl's rollout on every backend: seeds per draw (:mod:`.seeds`) and the agent loop that
hands them to the server (:mod:`.agent_loop`)."""
