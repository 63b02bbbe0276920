"""Text: vocabularies and tokenizers (SPM; BPE and chat templates to come)."""
