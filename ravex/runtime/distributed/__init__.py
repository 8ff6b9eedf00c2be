"""Several ranks: collectives (who we are, agreeing) apart from layout (who writes and
reads which part of a checkpoint)."""
