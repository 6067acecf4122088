"""Shared fixtures of the workload tests: offline mode, small datasets written in each workload's schema
and a tiny tokenizer built from a vocabulary file.

Nothing here downloads: the Hugging Face libraries are put in offline mode before they are imported.
"""

import os

for _var in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
    os.environ.setdefault(_var, "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

WORDS = (
    "the a an cat dog bird sat ran flew on over under mat log tree red blue green big small quick lazy "
    "is was and or not good bad film movie plot actor great awful fine dull fun"
).split()


@pytest.fixture(scope="session")
def tiny_tokenizer_dir(tmp_path_factory):
    """A WordPiece tokenizer (``BertTokenizerFast``) built from a small vocabulary file, saved to a folder."""
    from transformers import BertTokenizerFast

    d = tmp_path_factory.mktemp("tok")
    vocab = d / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS, "."]) + "\n")
    import inspect

    # transformers >= 5 takes the vocabulary as ``vocab``; 4.x as ``vocab_file``
    key = "vocab" if "vocab" in inspect.signature(BertTokenizerFast.__init__).parameters else "vocab_file"
    tok = BertTokenizerFast(**{key: str(vocab)}, do_lower_case=True)
    assert len(tok) == len(WORDS) + 6, "the vocabulary file was not read"
    out = d / "saved"
    tok.save_pretrained(str(out))
    return str(out)


def _sentences(rng: np.random.Generator, n: int, lo: int = 3, hi: int = 9) -> list:
    return [" ".join(rng.choice(WORDS, size=int(rng.integers(lo, hi)))) + " ." for _ in range(n)]


@pytest.fixture(scope="session")
def glue_dirs(tmp_path_factory):
    """``save_to_disk`` folders in GLUE's schema: ``{"cola": path, "mrpc": path, "stsb": path}``."""
    import datasets

    rng = np.random.default_rng(0)
    out = {}
    for task, n_train, n_dev in (("cola", 40, 12), ("mrpc", 30, 10), ("stsb", 30, 10)):
        splits = {}
        for split, n in (("train", n_train), ("validation", n_dev)):
            if task == "cola":
                cols = {
                    "sentence": _sentences(rng, n),
                    "label": [int(x) for x in rng.integers(0, 2, n)],
                    "idx": list(range(n)),
                }
            elif task == "mrpc":
                cols = {
                    "sentence1": _sentences(rng, n),
                    "sentence2": _sentences(rng, n),
                    "label": [int(x) for x in rng.integers(0, 2, n)],
                    "idx": list(range(n)),
                }
            else:
                cols = {
                    "sentence1": _sentences(rng, n),
                    "sentence2": _sentences(rng, n),
                    "label": [float(x) for x in rng.uniform(0, 5, n)],
                    "idx": list(range(n)),
                }
            splits[split] = datasets.Dataset.from_dict(cols)
        path = tmp_path_factory.mktemp(f"glue_{task}")
        datasets.DatasetDict(splits).save_to_disk(str(path))
        out[task] = str(path)
    return out


@pytest.fixture(scope="session")
def cifar_dirs(tmp_path_factory):
    """``save_to_disk`` folders in the hub CIFAR schemas, images as (32, 32, 3) uint8 arrays.

    ``{"cifar10": path (img, label), "cifar100": path (img, fine_label, coarse_label)}``; 60 train, 20 test.
    """
    import datasets

    rng = np.random.default_rng(1)
    out = {}
    for name, classes, label_col in (("cifar10", 10, "label"), ("cifar100", 20, "fine_label")):
        splits = {}
        for split, n in (("train", 60), ("test", 20)):
            imgs = rng.integers(0, 256, size=(n, 32, 32, 3), dtype=np.uint8)
            labels = (np.arange(n) % classes).astype(np.int64)
            cols = {"img": list(imgs), label_col: labels.tolist()}
            if name == "cifar100":
                cols["coarse_label"] = (labels // 5).tolist()
            features = datasets.Features(
                {
                    "img": datasets.Array3D(shape=(32, 32, 3), dtype="uint8"),
                    label_col: datasets.Value("int64"),
                    **({"coarse_label": datasets.Value("int64")} if name == "cifar100" else {}),
                }
            )
            splits[split] = datasets.Dataset.from_dict(cols, features=features)
        path = tmp_path_factory.mktemp(name)
        datasets.DatasetDict(splits).save_to_disk(str(path))
        out[name] = str(path)
    return out


@pytest.fixture(scope="session")
def text_corpus_dir(tmp_path_factory):
    """A ``save_to_disk`` folder in wikitext's schema (``text`` column; train/validation/test)."""
    import datasets

    rng = np.random.default_rng(2)
    splits = {
        s: datasets.Dataset.from_dict({"text": _sentences(rng, n, 5, 30)})
        for s, n in (("train", 120), ("validation", 30), ("test", 30))
    }
    path = tmp_path_factory.mktemp("corpus")
    datasets.DatasetDict(splits).save_to_disk(str(path))
    return str(path)
