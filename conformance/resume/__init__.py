"""The resume clause: a state_dict taken after k batches resumes with exactly the rest."""
