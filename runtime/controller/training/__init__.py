"""The training process's side of the controller: ``kdvfs run``'s launch and the bootstrap its child runs, how
a run ends, and the Hugging Face and Lightning callbacks."""
