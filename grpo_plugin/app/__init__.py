"""The application layer: recipes, data, the recipe pipeline, the model card, the plot and the Hub."""
