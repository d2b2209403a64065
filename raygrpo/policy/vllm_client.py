"""`PolicyClient` for a vLLM server's OpenAI-compatible `/v1/completions` endpoint, with token ids in and out.

The agent loop owns tokenization (the chat template, tool-result tokens, the env mask), so the client sends the
prompt as token ids and reads back the sampled token ids and their log-probabilities; no text is re-tokenized.

Request and response shapes were checked against:

- vLLM's `CompletionRequest` / `CompletionResponseChoice` (vllm/entrypoints/openai/protocol.py): `prompt` accepts a
  list of token ids; `return_token_ids: bool` (vLLM >= 0.10.2) adds `choices[i].token_ids` (the sampled ids,
  including the eos when the model stopped by itself) and `choices[i].prompt_token_ids`; `logprobs: int` returns
  `choices[i].logprobs = {text_offset, token_logprobs, tokens, top_logprobs}` where `token_logprobs[j]` is the
  log-probability of the j-th sampled token; `skip_special_tokens` (vLLM extra) only affects `text`;
  `return_tokens_as_token_ids` makes `logprobs.tokens` read `"token_id:<id>"`.
- TRL 1.16's own clients: `trl/generation/vllm_client.py` (`VLLMClient.generate`: `return_token_ids`,
  `choices[i]["prompt_token_ids"]`, `choices[i]["token_ids"]`) and
  `trl/experimental/async_grpo/async_rollout_worker.py` (`_generate_one_turn`: prompt ids, `n=1`, `logprobs=0`,
  `return_token_ids`, a random seed per request; reads `choice["token_ids"]` and
  `choice["logprobs"]["token_logprobs"]`).

Which log-probabilities the server returns depends on how it was started: TRL starts vLLM with
`--logprobs-mode processed_logprobs` (after temperature scaling), which is what GRPO's importance ratio needs; the
default `raw_logprobs` ignores the temperature. Start servers the TRL way. Whatever a server's `--generation-config`,
the client sends every sampling field (`NEUTRAL_SAMPLING` beside the run's temperature and top_p), so the model's
`generation_config.json` cannot change how turns are sampled.

vLLM itself cannot run on the CPU-only machines raygrpo is developed on: this client is tested against a FastAPI
fake with the same request/response shapes (`tests/fake_vllm.py`); the `vllm`-marked test exercises a real server
where one can run.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import httpx
from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt, wait_exponential

from raygrpo.policy.base import GenerationContext, PolicyError, SamplingParams
from raygrpo.core.types import UNVERSIONED, Turn

logger = logging.getLogger(__name__)


#: Sampling fields vLLM's server fills from the model's `generation_config.json` when a request leaves them out
#: (vLLM's `ModelConfig.get_diff_sampling_param`), at the values that leave the distribution untouched; `top_k` -1
#: is "off" in every vLLM version (0 too since 0.8; older ones refuse 0). TRL's `VLLMClient` sends the same.
NEUTRAL_SAMPLING: dict[str, Any] = {
    "top_k": -1,
    "min_p": 0.0,
    "repetition_penalty": 1.0,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
}


class _RetryableHTTPError(Exception):
    def __init__(self, status: int, body: str):
        super().__init__(f"HTTP {status}: {body}")
        self.status = status


def _is_retryable(exc: BaseException) -> bool:
    if isinstance(exc, _RetryableHTTPError):
        return True
    # Connection-level failures (refused, reset, connect timeout, dropped mid-response) are worth another try; a
    # read timeout means the server is busy with this very request, and a retry would only add to its load.
    return isinstance(exc, httpx.TransportError) and not isinstance(exc, httpx.ReadTimeout)


class VLLMClient:
    """Generates turns with a vLLM server, token ids in, token ids and log-probabilities out.

    The `httpx.AsyncClient` is created on first use, on the event loop that uses it (inside an env pool actor), and
    recreated if a later call comes from another loop. Connection errors, 5xx and 429 answers are retried up to
    `max_retries` times with exponential backoff; every failure ends as a `PolicyError` naming the URL.

    Args:
        base_url: Server root, e.g. `"http://10.0.0.5:8000"` (a trailing `/v1` is accepted too).
        model: The model name the server serves (`--served-model-name`, else the path it was started with).
        timeout_s: Deadline of one HTTP request (a whole generation).
        max_retries: Retries after the first attempt for retryable failures.
        logprobs: Number of top log-probabilities per token the server is asked for; the sampled token's own
            log-probability is always returned (TRL's async worker asks for 0).
        api_key: Bearer token, if the server was started with `--api-key`.
        backoff_s: First retry delay; doubles per retry, at most 4 s.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        timeout_s: float = 120.0,
        max_retries: int = 2,
        logprobs: int = 1,
        api_key: str | None = None,
        backoff_s: float = 0.25,
    ):
        url = base_url.rstrip("/")
        if url.endswith("/v1"):
            url = url[: -len("/v1")]
        self.base_url = url
        self.completions_url = f"{url}/v1/completions"
        self.model = model
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.logprobs = logprobs
        self.api_key = api_key
        self.backoff_s = backoff_s
        #: Version of the weights the server holds; the learner sets it after each weight sync.
        self.policy_version = UNVERSIONED  # TRL syncs the server's weights; the client cannot tell which it has
        self._client: httpx.AsyncClient | None = None
        self._client_loop: asyncio.AbstractEventLoop | None = None

    def _http(self) -> httpx.AsyncClient:
        loop = asyncio.get_running_loop()
        if self._client is None or self._client_loop is not loop or self._client.is_closed:
            headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else None
            self._client = httpx.AsyncClient(
                timeout=httpx.Timeout(self.timeout_s, connect=min(10.0, self.timeout_s)),
                limits=httpx.Limits(max_connections=1024, max_keepalive_connections=256),
                headers=headers,
            )
            self._client_loop = loop
        return self._client

    def request_body(self, prompt_ids: list[int], sampling: SamplingParams) -> dict[str, Any]:
        """The JSON body sent to `/v1/completions` for one turn.

        Every sampling field vLLM's server reads is sent, the run's (`temperature`, `top_p`) or neutral ones
        (`NEUTRAL_SAMPLING`): for a field a request leaves out, the server takes the model's `generation_config.json`
        (Qwen3's: top_k 20, top_p 0.95, temperature 0.6) unless it was started with `--generation-config vllm`, and
        the turns would then be sampled from another distribution than the one the learner computes log-probs of.
        """
        body: dict[str, Any] = {
            "model": self.model,
            "prompt": [int(t) for t in prompt_ids],
            "max_tokens": sampling.max_tokens,
            **NEUTRAL_SAMPLING,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "n": 1,
            "logprobs": self.logprobs,
            "return_token_ids": True,
            "return_tokens_as_token_ids": True,
            "skip_special_tokens": False,
        }
        if sampling.seed is not None:
            body["seed"] = sampling.seed
        return body

    async def generate(
        self, prompt_ids: list[int], sampling: SamplingParams, context: GenerationContext | None = None
    ) -> Turn:
        if sampling.max_tokens <= 0:
            return Turn(output_ids=[], logprobs=[], finish_reason="length", policy_version=self.policy_version)
        body = self.request_body(prompt_ids, sampling)
        data = await self._post(body)
        return self._parse(data, body["prompt"])

    async def _post(self, body: dict[str, Any]) -> dict[str, Any]:
        url = self.completions_url
        try:
            async for attempt in AsyncRetrying(
                stop=stop_after_attempt(self.max_retries + 1),
                wait=wait_exponential(multiplier=self.backoff_s, max=4.0),
                retry=retry_if_exception(_is_retryable),
                reraise=True,
            ):
                with attempt:
                    n = attempt.retry_state.attempt_number
                    if n > 1:
                        logger.warning("retrying %s (attempt %d of %d)", url, n, self.max_retries + 1)
                    response = await self._http().post(url, json=body)
                    if response.status_code >= 500 or response.status_code == 429:
                        raise _RetryableHTTPError(response.status_code, response.text[:300])
                    if response.status_code != 200:
                        raise PolicyError(
                            f"vLLM server {url} rejected the request: HTTP {response.status_code}: {response.text[:500]}"
                        )
                    return response.json()
        except PolicyError:
            raise
        except (_RetryableHTTPError, httpx.HTTPError, ValueError) as exc:
            raise PolicyError(
                f"vLLM server {url} failed after {self.max_retries + 1} attempt(s): {type(exc).__name__}: {exc}"
            ) from exc
        raise AssertionError("unreachable")  # pragma: no cover

    def _parse(self, data: dict[str, Any], prompt_ids: list[int]) -> Turn:
        url = self.completions_url
        try:
            choice = data["choices"][0]
            token_ids = choice.get("token_ids")
            lp = choice.get("logprobs") or {}
            if token_ids is None:
                # Servers older than vLLM 0.10.2 have no `return_token_ids`; `return_tokens_as_token_ids` still names
                # the sampled ids in `logprobs.tokens` as "token_id:<id>".
                token_ids = [int(str(t).rsplit(":", 1)[1]) for t in lp["tokens"]]
            token_ids = [int(t) for t in token_ids]
            token_logprobs = lp.get("token_logprobs")
            finish_reason = choice.get("finish_reason")
            echoed_prompt = choice.get("prompt_token_ids")
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            raise PolicyError(f"vLLM server {url} sent an unexpected response: {type(exc).__name__}: {exc}") from exc
        if token_logprobs is None or len(token_logprobs) != len(token_ids):
            n = None if token_logprobs is None else len(token_logprobs)
            raise PolicyError(f"vLLM server {url} sent {n} logprobs for {len(token_ids)} tokens")
        if any(x is None for x in token_logprobs):
            raise PolicyError(f"vLLM server {url} sent a null logprob for a sampled token")
        if echoed_prompt is not None and list(echoed_prompt) != list(prompt_ids):
            raise PolicyError(f"vLLM server {url} generated from a different prompt than the one sent (truncated?)")
        if finish_reason not in ("stop", "length"):
            raise PolicyError(f"vLLM server {url} ended the generation with finish_reason={finish_reason!r}")
        return Turn(
            output_ids=token_ids,
            logprobs=[float(x) for x in token_logprobs],
            finish_reason=finish_reason,
            policy_version=self.policy_version,
        )

    async def aclose(self) -> None:
        """Close the HTTP client. A client made on another (finished) loop cannot be closed from here: it is dropped."""
        if self._client is not None and not self._client.is_closed:
            if self._client_loop is asyncio.get_running_loop():
                await self._client.aclose()
            else:
                logger.debug("dropping an httpx client of another event loop")
        self._client = None
        self._client_loop = None
