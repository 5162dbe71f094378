# The study's entry point where the specification and the workflow catalog look for it:
#   snakemake --cores 1 all
# The workflow is workflow/Snakefile (its rules, schemas, report captions and profiles beside
# it); profiles/ links to workflow/profiles because Snakemake looks for the default profile next
# to the Snakefile it runs (its rerun-incomplete lets an interrupted study resume).
include: "workflow/Snakefile"


# `include:` keeps the including file's default target, and this file had none: a bare
# `snakemake` did nothing and `snakemake --report` died on an empty DAG (Snakemake 9.27). The
# workflow's own target, named again here.
rule default:
    default_target: True
    input:
        rules.all.input,
