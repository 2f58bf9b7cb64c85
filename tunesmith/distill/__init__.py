"""Knowledge distillation (`tunesmith distill`): a student trained on a teacher's next-token distributions over the
replies of SFT data (forward KL, reverse KL or GKD's generalized JSD), optionally plus the SFT loss."""
