# connector-tax: the KV connector substrate-tax study as a DAG.
#   snakemake --cores 1 all                                   # default study (simulator)
#   snakemake --cores 1 all --configfile configs/h20-qwen3-coder.yaml   # the real study
from snakemake.utils import min_version

min_version("8.0")


# The default study only when no --configfile is given: Snakemake would otherwise merge the
# two files key by key (a Phase A `shape` of one study mixed into another's).
if not workflow.config_settings.configfiles:

    configfile: "configs/default.yaml"


include: "workflow/rules/common.smk"
include: "workflow/rules/preflight.smk"
include: "workflow/rules/phase_a.smk"
include: "workflow/rules/reference.smk"
include: "workflow/rules/phase_b.smk"
include: "workflow/rules/analyze.smk"


onstart:
    print(f"connector-tax: study '{STUDY}', backend {config['backend']}, {len(CONFIGS)} configs -> {RESULTS}")


onsuccess:
    print(f"connector-tax: done; results in {RESULTS}")


onerror:
    print(f"connector-tax: failed; logs under {RESULTS}/logs and .snakemake/log")


rule all:
    default_target: True
    input:
        rules.manifest.output,
