"""The entropy floor: Theorem 4.2's bound (bound), our rank bound (rank_bound), the bound's inputs measured on a model (statistics) over its evaluation prompts' hidden states (prompt_states)."""
