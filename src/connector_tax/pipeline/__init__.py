"""The logic behind the Snakemake rules (the rules themselves stay thin)."""
