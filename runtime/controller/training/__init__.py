"""The training process's side of the controller: ``kdvfs run``'s launch and the bootstrap its child runs, the
torch module hooks that record the anchors inside each step, and the Hugging Face and Lightning callbacks."""
