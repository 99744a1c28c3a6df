"""DIVA-GRPO for verl 0.9.1: plugin (``verl_ext``), data preparation CLI and recipe."""

from setuptools import find_namespace_packages, setup

VERL = "verl[verl-core]==0.9.1"

setup(
    name="diva-grpo-verl",
    version="0.1.0",
    description="DIVA-GRPO (difficulty-adaptive variant advantage) for verl's V1 trainer",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    # `recipe` is a namespace shared with other distributions (TransferQueue ships recipe/simple_use_case),
    # so it has no __init__.py and only our subpackage is claimed.
    packages=find_namespace_packages(
        include=["verl_ext", "verl_ext.*", "data_prep", "data_prep.*", "recipe.diva_grpo", "recipe.diva_grpo.*"]
    ),
    package_data={"recipe.diva_grpo": ["config/*.yaml", "*.yaml", "README.md"]},
    install_requires=[
        VERL,
        "pyarrow>=19",
        "datasets",
        "pillow>=10.1",
        "numpy>=2.0",
        "openai>=1.40",
        "aiohttp",
        "math-verify>=0.7",
        "tqdm",
        "omegaconf",
        "hydra-core",
        "matplotlib",
        # MUPO's size-constrained k-means (imported only by MUPO's partition).
        "k-means-constrained>=0.9",
    ],
    extras_require={
        "test": ["pytest>=8", "pytest-timeout", "ruff==0.17.*", "sentence-transformers"],
        # MUPO's optional local embedding backend (mupo.embedding.backend=sentence_transformers).
        "embeddings-local": ["sentence-transformers"],
        # verl 0.9.1's own `vllm` extra: torch 2.11.0, torchvision 0.26.0, torchaudio 2.11.0, transformers 5.9.0,
        # vllm 0.24.0. flash-attn (verl's `flash-attn-cu130torch211` pin, 2.8.3) is not in it: its source
        # distribution imports torch to build, which pip's isolated build has not got; the README's GPU block
        # installs it after torch with --no-build-isolation, as flash-attn documents.
        "gpu": ["verl[vllm]==0.9.1"],
    },
    entry_points={
        "verl.plugins": ["diva_grpo = verl_ext.plugin"],
        "console_scripts": ["diva-prep = data_prep.cli:main", "diva-report = verl_ext.report.cli:main"],
    },
)
