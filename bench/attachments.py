"""The attachment figures of `make bench`: how close the engine's token estimate of PDFs and images comes
to what the provider bills for them, and the requests of a job that reads a long PDF and three images.

1. For a mix of PDFs and images (the package's samples, a 40-page PDF, images of a few sizes and
   shapes), for gpt-4o-mini and gpt-4o: the estimate the gateway reserves for the attachments
   (ModelGateway.plan with them less plan without them: engine.gateway.attachment_tokens) against what
   the local provider billed for them over HTTP (a call's prompt tokens with them less the same call's
   without them). The provider counts as OpenAI bills (aijobs.local.attachments): each resized side
   rounded to the pixel, a PDF page rendered at 150 DPI, its text at four characters a token; the
   estimate rounds every vague step up and prices text at two bytes a token, so it should stay at or
   above 1.0 and within 1.3.
2. A job with a 40-page PDF and three images, run by the engine's runner on moto with the objects in
   the payload bucket: its DynamoDB requests (the claim and the finish, as a text job's) and its S3
   requests (a HeadObject and a GetObject an attachment).
`python -m bench.attachments` runs it alone.
"""

from __future__ import annotations

import io
import json
import random
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import boto3
from PIL import Image
from pydantic import BaseModel
from pypdf import PdfWriter
from rich.console import Console

from aijobs.local.provider import LocalProvider
from aijobs.local.samples import INVOICE, PRODUCT_PHOTO, SCANNED_FORM, sample
from bench.report import Figure, print_figures
from bench.requests import SessionRequests
from bench.stacks import moto_stack
from engine.attachments.inspection import inspect
from engine.attachments.limits import OPENAI
from engine.attachments.loader import AttachmentLoader
from engine.core import Delivery, JobStatus
from engine.core.attachments import ALL_TYPES, Attachment, AttachmentPolicy, AttachmentRef
from engine.dead_letters import DeadLetterRecorder
from engine.definitions import JobDefinition, JobRegistry, Prompt
from engine.gateway import ModelGateway, ModelTiers
from engine.gateway.openai import OpenAICompatibleProvider, static_api_key
from engine.runner import JobRunner
from engine.store import DynamoJobStore
from engine.store.attachments import S3Attachments

MODELS = ("gpt-4o-mini", "gpt-4o")
LOW, HIGH = 1.0, 1.3
# Images made at run time: (width, height, format); a photo's and a scan's shapes, small to past 2048.
IMAGE_SIZES = ((256, 256, "PNG"), (1024, 768, "JPEG"), (1600, 1200, "WEBP"), (2480, 3508, "PNG"), (600, 4000, "JPEG"))
LONG_PDF_PAGES = 40
A4_POINTS = (595, 842)


class Question(BaseModel):
    question: str


class Answer(BaseModel):
    answer: str


# One prompt with or without attachments, so that the difference between two calls is theirs alone.
READ_DOCUMENTS = JobDefinition(
    name="bench_read_documents",
    input_model=Question,
    output_model=Answer,
    prompt=Prompt(key="bench_read_documents", version="1", system="Answer from the attachments.", user="{question}"),
    max_tokens=64,
    attachments=AttachmentPolicy(max_count=20, media_types=ALL_TYPES),
)
QUESTION = Question(question="What do the attachments show?")


@dataclass(frozen=True, slots=True)
class Measured:
    name: str
    is_pdf: bool
    estimate: int
    billed: int

    @property
    def ratio(self) -> float:
        return self.estimate / self.billed


def blank_pdf(pages: int, size: tuple[float, float] = A4_POINTS) -> bytes:
    writer = PdfWriter()
    for _ in range(pages):
        writer.add_blank_page(*size)
    out = io.BytesIO()
    writer.write(out)
    return out.getvalue()


def made_image(width: int, height: int, kind: str) -> bytes:
    """An image of noise in the top-left corner (so that it does not compress to nothing), grey elsewhere."""
    picture = Image.new("RGB", (width, height), (200, 200, 200))
    noise = random.Random(width * height).randbytes(64 * 64 * 3)
    picture.paste(Image.frombytes("RGB", (64, 64), noise))
    out = io.BytesIO()
    picture.save(out, kind)
    return out.getvalue()


def mix() -> list[tuple[str, bytes]]:
    """The files measured: the samples, a long PDF, and images of several sizes."""
    files = [(name, sample(name)) for name in (INVOICE, SCANNED_FORM, PRODUCT_PHOTO)]
    files.append((f"blank-{LONG_PDF_PAGES}-pages.pdf", blank_pdf(LONG_PDF_PAGES)))
    files += [(f"{w}x{h}.{kind.lower()}", made_image(w, h, kind)) for w, h, kind in IMAGE_SIZES]
    return files


def read(name: str, data: bytes) -> Attachment:
    """The attachment as the engine reads it."""
    return inspect(AttachmentRef("bench", f"attachments/{name}", name), data)


@contextmanager
def local_gateway(model: str) -> Iterator[ModelGateway]:
    """The engine's gateway for `model`, against the local provider over HTTP."""
    provider = LocalProvider(api_key="k", latency_seconds=0.0).start()
    try:
        yield ModelGateway(OpenAICompatibleProvider(provider.url, static_api_key("k")), ModelTiers(model))
    finally:
        provider.stop()


def measure_attachment(gateway: ModelGateway, name: str, attachment: Attachment) -> Measured:
    """The estimate and the billed tokens of one attachment, each less the same request without it."""
    estimate = (
        gateway.plan(READ_DOCUMENTS, QUESTION, (attachment,)).first_call_tokens
        - gateway.plan(READ_DOCUMENTS, QUESTION).first_call_tokens
    )
    with_it = gateway.execute(READ_DOCUMENTS, QUESTION, attachments=(attachment,))
    without = gateway.execute(READ_DOCUMENTS, QUESTION)
    for execution in (with_it, without):
        if execution.error is not None:
            raise RuntimeError(f"a bench call for {name} failed: {execution.error}")
    return Measured(name, attachment.info.pages is not None, estimate, with_it.input_tokens - without.input_tokens)


def estimates(model: str, files: Sequence[tuple[str, bytes]]) -> list[Measured]:
    with local_gateway(model) as gateway:
        return [measure_attachment(gateway, name, read(name, data)) for name, data in files]


def ratio_figure(model: str, kind: str, measured: Sequence[Measured]) -> Figure:
    ratios = [item.ratio for item in measured]
    total = sum(item.estimate for item in measured) / sum(item.billed for item in measured)
    widest = max(measured, key=lambda item: item.ratio)
    return Figure(
        f"attachments: estimate ÷ billed, {kind}, {model}",
        f"{total:.3f}  (each {min(ratios):.3f} to {max(ratios):.3f}; widest {widest.name} "
        f"{widest.estimate}/{widest.billed})",
        f"{LOW} to {HIGH} each",
        all(LOW <= ratio <= HIGH for ratio in ratios),
        f"{len(measured)} files: ModelGateway.plan with less without the file, against the local provider's "
        "prompt_tokens with less without it (OpenAI's formulas, over HTTP)",
    )


@dataclass(frozen=True, slots=True)
class JobRequests:
    status: JobStatus
    dynamodb: dict[str, int]
    s3: dict[str, int]


def long_job_requests() -> JobRequests:
    """A job with a 40-page PDF and three images, run once by the engine's runner: its AWS requests."""
    files = [(f"report-{LONG_PDF_PAGES}-pages.pdf", blank_pdf(LONG_PDF_PAGES))]
    files += [(f"photo-{n}.jpeg", made_image(1024, 768, "JPEG")) for n in range(1, 4)]
    with moto_stack() as stack, local_gateway("gpt-4o-mini") as gateway:
        setup = boto3.client("s3")
        refs = []
        for name, data in files:
            key = f"attachments/bench-long/{name}"
            setup.put_object(Bucket=stack.payload_bucket, Key=key, Body=data)
            refs.append({"s3": f"s3://{stack.payload_bucket}/{key}", "name": name})
        session = boto3.Session()
        counted = SessionRequests(session)
        registry = JobRegistry([READ_DOCUMENTS])
        store = DynamoJobStore(stack.table_name, client=session.client("dynamodb"))
        loader = AttachmentLoader(S3Attachments(lambda: session.client("s3")), {stack.payload_bucket}, OPENAI)
        runner = JobRunner(
            store, gateway, registry, DeadLetterRecorder(store, registry), rng=random.Random(1), attachments=loader
        )
        body = {
            "job_id": "bench-long",
            "job_type": READ_DOCUMENTS.name,
            "user_id": "bench",
            "input": QUESTION.model_dump(),
            "attachments": refs,
        }
        runner.process(Delivery("m-long", json.dumps(body)))
        dynamodb, s3 = dict(counted.of("dynamodb")), dict(counted.of("s3"))
        job = DynamoJobStore(stack.table_name).get_job("bench-long")
        if job is None:
            raise RuntimeError("the bench's job was never written")
        return JobRequests(job.status, dynamodb, s3)


def count_detail(operations: dict[str, int]) -> str:
    return " + ".join(f"{count} {operation}" for operation, count in sorted(operations.items()))


def attachments_figures(console: Console) -> list[Figure]:
    files = mix()
    figures = []
    for model in MODELS:
        console.print(f"attachments: estimate against billed for {len(files)} files, {model} ...")
        measured = estimates(model, files)
        figures.append(ratio_figure(model, "PDFs", [item for item in measured if item.is_pdf]))
        figures.append(ratio_figure(model, "images", [item for item in measured if not item.is_pdf]))
    console.print(f"attachments: a job with a {LONG_PDF_PAGES}-page PDF and 3 images ...")
    job = long_job_requests()
    dynamodb, s3 = sum(job.dynamodb.values()), sum(job.s3.values())
    figures.append(
        Figure(
            f"attachments: DynamoDB requests, a job with a {LONG_PDF_PAGES}-page PDF and 3 images",
            f"{dynamodb} ({count_detail(job.dynamodb)}); S3 {s3} ({count_detail(job.s3)}); {job.status}",
            "= 2 (+ S3 reads)",
            dynamodb == 2 and job.status is JobStatus.SUCCEEDED,
            "the engine's runner on moto, the job's message naming 4 objects in the payload bucket; botocore "
            "before-call hook on its session",
        )
    )
    return figures


def main() -> int:
    print_figures("aijobs bench, attachments", attachments_figures)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
