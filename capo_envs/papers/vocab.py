"""Word lists for SynthScholar's generated papers: research fields, their tasks, methods, and filler.

Tasks and methods are real-sounding computer-science phrases; each method also gets an invented alias (a
named model, as papers often say "BERT" rather than "masked language model pretraining"), generated in
``world.py``. The filler words that pad titles and abstracts share no word with any method or task, so
that a paper written with a method's alias never matches the method's canonical words (the property that
makes some gold papers reachable only by expanding citations).
"""

from __future__ import annotations

FIELDS: dict[str, tuple[str, ...]] = {
    "natural language processing": (
        "machine translation", "question answering", "text summarization", "named entity recognition",
        "sentiment analysis", "dialogue state tracking", "semantic parsing", "coreference resolution",
        "relation extraction", "fact verification", "code generation", "grammatical error correction",
        "document retrieval", "open-domain question answering", "keyphrase extraction", "text simplification",
        "math word problems", "instruction following",
    ),
    "computer vision": (
        "image classification", "object detection", "semantic segmentation", "instance segmentation",
        "depth estimation", "optical flow", "image captioning", "visual question answering", "pose estimation",
        "image super-resolution", "video action recognition", "person re-identification", "scene graph generation",
        "image inpainting", "3d reconstruction", "novel view synthesis", "visual tracking",
    ),
    "speech and audio": (
        "speech recognition", "speaker verification", "speech synthesis", "voice conversion", "speech enhancement",
        "sound event detection", "music transcription", "spoken language understanding", "audio captioning",
        "keyword spotting",
    ),
    "robotics and control": (
        "robotic grasping", "legged locomotion", "motion planning", "visual navigation", "dexterous manipulation",
        "imitation from demonstrations", "autonomous driving", "multi-robot coordination", "sim-to-real transfer",
        "trajectory forecasting",
    ),
    "graphs and data mining": (
        "link prediction", "node classification", "graph classification", "community detection",
        "recommender systems", "knowledge graph completion", "anomaly detection", "time series forecasting",
        "click-through rate prediction", "entity alignment", "traffic forecasting", "fraud detection",
    ),
    "machine learning theory": (
        "generalization bounds", "online convex optimization", "multi-armed bandits", "sample complexity",
        "causal discovery", "domain adaptation", "continual learning", "federated optimization",
        "hyperparameter optimization", "uncertainty calibration", "out-of-distribution detection",
        "neural architecture search", "adversarial robustness", "model compression", "differential privacy",
    ),
    "computational science": (
        "protein structure prediction", "molecular property prediction", "drug-target interaction",
        "weather forecasting", "partial differential equations", "materials discovery", "medical image segmentation",
        "clinical outcome prediction", "single-cell analysis", "retrosynthesis planning", "climate downscaling",
    ),
    "security and systems": (
        "malware detection", "intrusion detection", "vulnerability discovery", "program repair",
        "compiler optimization", "cache replacement", "job scheduling", "query optimization", "log parsing",
        "smart contract auditing",
    ),
}  # fmt: skip

METHODS: tuple[str, ...] = (
    "contrastive pretraining", "sparse attention", "diffusion models", "graph neural networks",
    "knowledge distillation", "prompt tuning", "low-rank adaptation", "mixture of experts",
    "variational autoencoders", "normalizing flows", "energy-based models", "meta-learning",
    "curriculum learning", "self-training", "pseudo-labeling", "active learning", "bayesian optimization",
    "gaussian processes", "kernel methods", "random features", "neural ordinary differential equations",
    "implicit neural representations", "vision transformers", "state space models", "recurrent memory",
    "hypernetworks", "capsule networks", "spiking neural networks", "evolutionary search",
    "monte carlo tree search", "policy gradients", "actor-critic methods", "offline reinforcement learning",
    "inverse reinforcement learning", "model-based planning", "world models", "optimal transport",
    "wasserstein distances", "adversarial training", "data augmentation", "mixup regularization",
    "dropout variants", "weight pruning", "quantization-aware training", "early exiting", "retrieval augmentation",
    "chain-of-thought prompting", "in-context learning", "instruction tuning", "preference optimization",
    "reward modeling", "tool use", "program synthesis", "symbolic regression", "neurosymbolic reasoning",
    "causal inference", "counterfactual explanations", "saliency maps", "concept bottlenecks",
    "federated averaging", "secure aggregation", "homomorphic encryption", "split learning", "hashing codes",
    "product quantization", "locality-sensitive hashing", "dense retrieval", "cross-encoders", "late interaction",
    "masked autoencoders", "denoising objectives", "siamese networks", "triplet losses", "metric learning",
    "prototype networks", "label smoothing", "focal losses", "conformal prediction", "deep ensembles",
    "monte carlo dropout", "evidential learning", "test-time adaptation", "domain randomization",
    "feature alignment", "style transfer", "cycle consistency", "neural radiance fields", "point cloud networks",
    "equivariant networks", "message passing", "attention pooling", "hierarchical clustering", "spectral methods",
    "tensor decomposition", "matrix factorization", "boosted trees", "linear probing", "early fusion",
)  # fmt: skip

# Filler: generic research words in no method or task above
# (checked by tests/test_papers_env.py::test_filler_words_never_name_a_method_or_task).
FILLER_ADJECTIVES = (
    "robust", "efficient", "scalable", "principled", "practical", "unified", "lightweight", "accurate",
    "interpretable", "reliable", "flexible", "simple", "strong", "faithful", "stable", "general",
)
FILLER_NOUNS = (
    "framework", "formulation", "pipeline", "objective", "algorithm", "estimator", "baseline",
    "benchmark", "protocol", "toolkit", "perspective", "recipe", "study",
)
CHALLENGES = (
    "scarce annotations", "dataset shift", "noisy supervision", "limited compute", "long inputs",
    "class imbalance", "missing values", "strict latency budgets", "confidentiality constraints", "heavy-tailed errors",
)
VERBS = ("improves", "simplifies", "stabilizes", "accelerates", "generalizes", "strengthens", "extends")
GENERIC_SENTENCES = (
    "The {adj} {noun} is easy to implement and adds little overhead.",
    "We release software and a {adj} {noun} to support reproducible comparisons.",
    "An ablation {noun} isolates the contribution of each component.",
    "Our {noun} remains {adj} under {challenge}.",
    "We further provide a {adj} theoretical {noun} of the proposed approach.",
    "Results hold across scales and evaluation settings.",
    "Careful adjustment of strong baselines narrows but does not close the gap.",
)
CANONICAL_TITLES = (
    "{M} for {T}", "{N}: {M} for {T}", "Improving {T} with {M}", "Towards {Adj} {T} via {M}",
    "On {M} for {T}", "Rethinking {M} in {T}", "{Adj} {M} for {T}", "{N}: {Adj} {T} with {M}",
    "When {M} Meets {T}", "An Empirical Study of {M} for {T}",
)
ALIAS_TITLES = (
    "{A} for {T}", "{N}: {T} with {A}", "Revisiting {T} through {A}", "{A}-Based {T}", "{Adj} {T} with {A}",
    "{N}: Scaling {A} to {T}",
)
QUESTION_TEMPLATES = (
    "Which studies apply {m} to {t}?",
    "Could you provide me some works that use {m} for {t}?",
    "What papers propose {m} approaches for {t}?",
    "Could you list the works exploiting {m} in {t}?",
    "Which works study {t} with {m}?",
    "Can you recommend research on {m} for {t}?",
)
