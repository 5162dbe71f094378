# connector-tax: the KV connector substrate-tax study as a DAG.
#   snakemake --cores 1 all                                   # default study (simulator)
#   snakemake --cores 1 all --configfile configs/h20-qwen3-coder.yaml   # the real study
from snakemake.utils import min_version

min_version("8.0")


configfile: "configs/default.yaml"


include: "workflow/rules/common.smk"
include: "workflow/rules/preflight.smk"


onstart:
    print(f"connector-tax: study '{STUDY}', backend {config['backend']}, {len(CONFIGS)} configs -> {RESULTS}")


onsuccess:
    print(f"connector-tax: done; results in {RESULTS}")


onerror:
    print(f"connector-tax: failed; logs under {RESULTS}/logs and .snakemake/log")


rule all:
    default_target: True
    input:
        f"{RESULTS}/preflight/preflight_status.json",
