"""PPO held near its clone: stable-baselines3's PPO plus a behaviour-cloning anchor after each update.

Initialising PPO from the clone is not enough to keep what the clone knows: the first updates, driven by a
critic still learning the new returns, can move the policy away from the expert in states where the reward
gives no clear signal. :class:`AnchoredPPO` keeps the expert's decisions as a standing term of the
objective: after each PPO update it takes ``anchor_batches`` gradient steps on

    anchor_coef * -log pi(a_expert | s)

over minibatches of the recorded demonstrations (observations normalised with the frozen statistics the
policy sees), with PPO's own optimizer. PPO's clipped objective moves the policy where its advantage
estimates say; the anchor pulls it back where they do not, so the policy departs from the clone only where
the return pays for it. With ``anchor_coef`` 0 it is plain PPO.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from stable_baselines3 import PPO

from kdvfs.common.arrays import Array


class AnchoredPPO(PPO):
    """``stable_baselines3.PPO`` with the anchor of the module docstring (set by :meth:`anchor`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._demonstrations: tuple[torch.Tensor, torch.Tensor] | None = None
        self._anchor_coef, self._anchor_batches, self._anchor_batch_size = 0.0, 0, 1
        self._anchor_generator = torch.Generator()

    def anchor(self, observations: Array, actions: Array, coef: float, batches: int, batch_size: int,
               seed: int) -> None:
        """Anchor to the expert's ``actions`` at ``observations`` (normalised as the policy sees them)."""
        self._demonstrations = (torch.as_tensor(observations, dtype=torch.float32), torch.as_tensor(actions))
        self._anchor_coef, self._anchor_batches, self._anchor_batch_size = coef, batches, batch_size
        self._anchor_generator.manual_seed(seed)

    def train(self) -> None:
        """PPO's update, then the anchor's gradient steps (logged as ``anchor/expert_nll``)."""
        super().train()
        if self._demonstrations is None or self._anchor_coef == 0.0:
            return
        observations, actions = self._demonstrations
        losses = []
        for _ in range(self._anchor_batches):
            batch = torch.randint(len(observations), (self._anchor_batch_size,), generator=self._anchor_generator)
            _, log_prob, _ = self.policy.evaluate_actions(observations[batch], actions[batch])
            loss = -log_prob.mean()
            self.policy.optimizer.zero_grad()
            (self._anchor_coef * loss).backward()
            torch.nn.utils.clip_grad_norm_(self.policy.parameters(), self.max_grad_norm)
            self.policy.optimizer.step()
            losses.append(float(loss.detach()))
        self.logger.record("anchor/expert_nll", float(np.mean(losses)))
