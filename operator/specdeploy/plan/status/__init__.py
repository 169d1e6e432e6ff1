"""What the status says: conditions, the status document and its patch, refused writes, crash loops
and the launcher's verdict on the pair."""
