"""The online stage every online recipe shares (issue 39): sampling, scoring, and what a loss over rollouts reads."""
