# The study's entry point where the specification and the workflow catalog look for it:
#   snakemake --cores 1 all
# The workflow is workflow/Snakefile (its rules, schemas, report captions and profiles beside
# it); profiles/ links to workflow/profiles because Snakemake looks for the default profile next
# to the Snakefile it runs (its rerun-incomplete lets an interrupted study resume).
include: "workflow/Snakefile"
