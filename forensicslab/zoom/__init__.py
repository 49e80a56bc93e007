"Zoom study (Defake-o3): zoom-in agent, artifact benchmark, rewards, tiny VLM, evidence verifier, SFT + GRPO training, evaluation."
