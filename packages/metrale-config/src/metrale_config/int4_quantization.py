"""``Int4Quantization``: an AWQ or GPTQ 4-bit checkpoint's ``quantization_config``, as parsed.

The on-disk layouts it names are described where they are read
(``metrale_model_arch.loading.int4_checkpoints``).
"""

from __future__ import annotations

import enum

import attrs


class Int4Method(enum.StrEnum):
    AWQ = "awq"
    GPTQ = "gptq"


@attrs.frozen(kw_only=True)
class Int4Quantization:
    """4-bit weights in groups of ``group_size`` input features sharing a float16 scale and an
    integer zero point (``w = (q - z) * s``), the layers' projections only.

    ``group_size`` ``None``: one group over all input features (GPTQ's ``-1``). AWQ (GEMM
    packing) always has zero points; GPTQ's are ``8`` when ``is_symmetric``. ``desc_act``:
    GPTQ's act-order, each input feature's group given by the checkpoint's ``g_idx``.
    """

    method: Int4Method
    group_size: int | None
    is_symmetric: bool = False
    desc_act: bool = False

    def describe(self) -> str:
        """``gptq int4, group 128, symmetric, desc_act``: for logs and errors."""
        parts = [f"{self.method} int4", f"group {self.group_size or 'whole row'}"]
        if self.method == Int4Method.GPTQ:
            parts.append("symmetric" if self.is_symmetric else "asymmetric")
            if self.desc_act:
                parts.append("desc_act")
        return ", ".join(parts)
