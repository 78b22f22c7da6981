"""The paper's own numbers and statements, quoted once, for every report to print beside vitkit's.

Dosovitskiy et al., "An Image is Worth 16x16 Words", ICLR 2021, arXiv:2010.11929.  `source` says where
each quote was read: SEEDS, the copy of the paper kept with this project, is cited as the paper; what
that copy lacks (Table 8's body, App. D.2, D.5, D.7 and the caption of Figure 9) is quoted from
arXiv:2010.11929v2 and cites that version.  Numbers the paper gives only as a statement stay a statement; a
number derived from one (e.g. 79.9 - 2 for "training from scratch") is marked derived.
"""

from __future__ import annotations

from dataclasses import dataclass, field

SEEDS = "arXiv:2010.11929"  # the project's copy of the paper, cited as the paper a reader can find
ARXIV = "arXiv:2010.11929v2"  # parts that copy lacks, read from the arXiv version


@dataclass(frozen=True)
class PaperClaim:
    where: str  # section, table or figure
    quote: str  # the paper's words
    source: str  # SEEDS or ARXIV
    numbers: dict[str, float] = field(default_factory=dict)  # what the paper reports, by name
    note: str = ""  # how a number was derived, or what the paper measured on


# App. D.4, Table 8: ImageNet 5-shot linear accuracy of ViT-B/16 per position embedding and where it is added.
# The seeds hold D.4's text but not the table's body: the values are the paper's (arXiv:2010.11929v2, Table 8).
TABLE_8: dict[tuple[str, str], float] = {
    ("none", "input"): 0.61382,
    ("learned_1d", "input"): 0.64206,
    ("learned_1d", "per_layer"): 0.63964,
    ("learned_1d", "shared_per_layer"): 0.64292,
    ("learned_2d", "input"): 0.64001,
    ("learned_2d", "per_layer"): 0.64046,
    ("learned_2d", "shared_per_layer"): 0.64022,
    ("relative", "input"): 0.64032,
}

POSEMB_GAP = PaperClaim(
    where="App. D.4, Table 8",
    source=SEEDS + "; Table 8's numbers: " + ARXIV,
    quote=(
        "while there is a large gap between the performances of the model with no positional embedding and "
        "models with positional embedding, there is little to no difference between different ways of encoding "
        "positional information."
    ),
    numbers={f"{kind}@{where}": value for (kind, where), value in TABLE_8.items()},
    note="ViT-B/16 pre-trained on JFT-300M, ImageNet 5-shot linear accuracy",
)

HEAD_LR = PaperClaim(
    where="App. D.3, Figure 9",
    source=SEEDS + "; the caption: " + ARXIV,
    quote=(
        "An initial attempt at using only image-patch embeddings, globally average-pooling (GAP) them, followed "
        "by a linear classifier [...] performed very poorly. However, we found that this is neither due to the "
        "extra token, nor to the GAP operation. Instead, the difference in performance is fully explained by the "
        "requirement for a different learning-rate, see Figure 9.  (Figure 9: Both work similarly well, but "
        "require different learning-rates.)"
    ),
    note="Figure 9 gives curves, not numbers",
)

DATA_SIZE = PaperClaim(
    where="Sec. 4.3, Figures 3 and 4",
    source=SEEDS,
    quote=(
        "Vision Transformers overfit more than ResNets with comparable computational cost on smaller datasets. "
        "For example, ViT-B/32 is slightly faster than ResNet50; it performs much worse on the 9M subset, but better "
        "on 90M+ subsets.  (Figure 4: ResNets perform better with smaller pre-training datasets but plateau sooner "
        "than ViT, which performs better with larger pre-training.  Figure 3: The BiT CNNs outperform ViT on "
        "ImageNet, but with the larger datasets, ViT overtakes.)"
    ),
    note="JFT-300M subsets of 9M, 30M, 90M, 300M images; ImageNet 5-shot linear (Figure 4) and fine-tuned (Figure 3)",
)

COMPUTE = PaperClaim(
    where="Sec. 4.4, Figure 5",
    source=SEEDS,
    quote=(
        "Vision Transformers dominate ResNets on the performance/compute trade-off. ViT uses approximately 2 - 4x "
        "less compute to attain the same performance (average over 5 datasets). Second, hybrids slightly outperform "
        "ViT at small computational budgets, but the difference vanishes for larger models."
    ),
    numbers={"compute_ratio_low": 2.0, "compute_ratio_high": 4.0},
    note="JFT-300M pre-training compute in exaFLOPs, transfer accuracy averaged over 5 data sets",
)

SHAPE = PaperClaim(
    where="App. D.2, Figure 8",
    source=ARXIV,
    quote=(
        "We can see that scaling the depth results in the biggest improvements which are clearly visible up until "
        "64 layers. However, diminishing returns are already visible after 16 layers. Interestingly, scaling the "
        "width of the network seems to result in the smallest changes. Decreasing the patch size and thus increasing "
        "the effective sequence length shows surprisingly robust improvements without introducing parameters."
    ),
    note="base: ViT with 8 layers, D=1024, D_MLP=2048, patch 32; ImageNet 5-shot linear",
)

MPP = PaperClaim(
    where="Sec. 4.6, App. B.1.2",
    source=SEEDS,
    quote=(
        "With self-supervised pre-training, our smaller ViT-B/16 model achieves 79.9% accuracy on ImageNet, a "
        "significant improvement of 2% to training from scratch, but still 4% behind supervised pre-training."
    ),
    numbers={"mpp": 79.9, "gain_over_scratch": 2.0, "behind_supervised": 4.0, "scratch": 77.9, "supervised": 83.9},
    note="scratch 77.9 = 79.9 - 2 and supervised 83.9 = 79.9 + 4 are derived from the statement; MPP on JFT, "
    "fine-tuned on ImageNet",
)

ATTENTION = PaperClaim(
    where="Sec. 4.5, Figure 7 (right); App. D.7, Figure 11",
    source=SEEDS + "; D.7: " + ARXIV,
    quote=(
        "We find that some heads attend to most of the image already in the lowest layers, showing that the "
        "ability to integrate information globally is indeed used by the model. Other attention heads have "
        "consistently small attention distances in the low layers. [...] Further, the attention distance increases "
        "with network depth.  (D.7: As depth increases, attention distance increases for all heads.)"
    ),
    note="ViT-L/16, 128 images of 224 px, mean attention distance per head and layer",
)

SPEED = PaperClaim(
    where="App. D.5, Figure 12",
    source=ARXIV + "; the pairs: Sec. 4.3, " + SEEDS,
    quote=(
        "Figure 12: Left: Real wall-clock timings of various architectures across input sizes. ViT models have "
        "speed comparable to similar ResNets. Right: Largest per-core batch-size fitting on device with various "
        "architectures across input sizes. ViT models are clearly more memory-efficient.  (Sec. 4.3: ViT-B/32 is "
        "slightly faster than ResNet50 [...] The same is true for ResNet152x2 and ViT-L/16.)"
    ),
    note="inference on one TPUv3 core",
)

# Table 2 (CIFAR-10 column) and Table 5 (ViT-B/16's CIFAR-10 row by pre-training set): fine-tuned at 384 px.
TABLE_2_CIFAR10 = {"ViT-H/14 (JFT)": 99.50, "ViT-L/16 (JFT)": 99.42, "ViT-L/16 (I21k)": 99.15, "BiT-L (JFT)": 99.37}
TABLE_5_B16_CIFAR10 = {"ImageNet": 98.13, "ImageNet-21k": 98.95, "JFT-300M": 99.00}

TRANSFER = PaperClaim(
    where="Sec. 1 and 3.2; Tables 2 and 5",
    source=SEEDS + "; Table 2's and Table 5's numbers: " + ARXIV,
    quote=(
        "When trained on mid-sized datasets such as ImageNet without strong regularization, these models yield "
        "modest accuracies of a few percentage points below ResNets of comparable size. [...] However, the picture "
        "changes if the models are trained on larger datasets (14M-300M images). We find that large scale training "
        "trumps inductive bias. Our Vision Transformer (ViT) attains excellent results when pre-trained at "
        "sufficient scale and transferred to tasks with fewer datapoints.  (Sec. 3.2: Typically, we pre-train ViT "
        "on large datasets, and fine-tune to (smaller) downstream tasks.)"
    ),
    numbers={
        **{f"CIFAR-10 {name}, Table 2": value for name, value in TABLE_2_CIFAR10.items()},
        **{f"CIFAR-10 ViT-B/16 from {name}, Table 5": value for name, value in TABLE_5_B16_CIFAR10.items()},
    },
    note="ViT-B/16 to ViT-H/14 pre-trained on ImageNet (1.3M images), ImageNet-21k (14M) or JFT-300M, fine-tuned "
    "at 384 px with SGD; the paper reports no CIFAR-10 model trained from scratch",
)

LOW_DATA = PaperClaim(
    where="Sec. 4.2 (VTAB, 1,000 examples a task); Sec. 4.3",
    source=SEEDS,
    quote=(
        "VTAB evaluates low-data transfer to diverse tasks, using 1 000 training examples per task. [...] Overall, "
        "the few-shot results on ImageNet (Figure 4), as well as the low-data results on VTAB (Table 2) seem "
        "promising for very low-data transfer."
    ),
    note="the paper measures low-data transfer (VTAB-1k, few-shot) but states no gain over training from scratch",
)

FEWSHOT = PaperClaim(
    where="Sec. 4.1 (Metrics), Figure 4",
    source=SEEDS,
    quote=(
        "Few-shot accuracies are obtained by solving a regularized least-squares regression problem that maps the "
        "(frozen) representation of a subset of training images to {-1, 1}^K target vectors. [...] (Figure 4: "
        "Linear few-shot evaluation on ImageNet versus pre-training size. ResNets perform better with smaller "
        "pre-training datasets but plateau sooner than ViT, which performs better with larger pre-training.)"
    ),
    note="the paper gives no accuracy of a randomly initialised encoder; Figure 4 is 5-shot ImageNet after JFT subsets",
)

HYBRID_SMALL = PaperClaim(
    where="Sec. 4.4, Figure 5",
    source=SEEDS,
    quote="Second, hybrids slightly outperform ViT at small computational budgets, but the difference vanishes for "
    "larger models.",
    note="JFT-300M pre-training compute in exaFLOPs, transfer accuracy averaged over 5 data sets",
)
