"""Reading, chunking, embedding and searching documents."""
