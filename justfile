# Seed A's reproducer recipes (`just` comes with the dev extra: pip install rust-just).
#   seed=42 grad_clip=1.0 just phase-19-train      -> experiments/19-control/run
#   seed=42 grad_clip=inf just phase-19-train      -> experiments/19-break-no-clip/run
#   just phase-19-compare experiments/19-control experiments/19-break-no-clip

seed := env_var_or_default("seed", "42")
grad_clip := env_var_or_default("grad_clip", "1.0")
bin := if path_exists(".venv/bin/spikecheck") == "true" { ".venv/bin/" } else { "" }
experiment := if grad_clip == "inf" { "19-break-no-clip" } else if grad_clip == "none" { "19-break-no-clip" } else { "19-control" }

phase-19-train:
    {{bin}}spikecheck train experiments/{{experiment}} --seed {{seed}} --grad-clip {{grad_clip}}

phase-19-compare control="experiments/19-control" broken="experiments/19-break-no-clip":
    {{bin}}spikecheck compare {{control}} {{broken}} --out out/phase-19

# The high-LR pair (attention-logit growth and its qk-layernorm twin): just high-lr-demo
high-lr-demo:
    {{bin}}spikecheck train experiments/high-lr-qk-layernorm --quiet
    {{bin}}spikecheck train experiments/high-lr-break --quiet
    {{bin}}spikecheck compare experiments/high-lr-qk-layernorm experiments/high-lr-break --out out/high-lr
    {{bin}}spikecheck diagnose experiments/high-lr-break
